"""The headless client: the document, the model that builds it from the wire, the subscriber feed,
units (every number's wording), ranks, slow resources and settings. No Textual, no torch: the TUI,
the text and HTML reports, the exporter, `tune` and the recordings are its clients."""

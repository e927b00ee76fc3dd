"""Views that are not the TUI: the text/JSON report and the palette the reports share."""

"""The Textual app: one module per panel under `widgets/`, the theme, the live and replay apps."""

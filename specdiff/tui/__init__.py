"""The Textual TUI: one client of the headless core. It renders records (TokenSteps,
comparisons, results); every number it shows is computed by the core."""

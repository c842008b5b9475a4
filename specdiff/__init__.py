"""specdiff: why the same prompt at temperature 0 gives different text.

The headless core (``specdiff.engine``, ``specdiff.lanes``, ``specdiff.steps``,
``specdiff.compare``, ``specdiff.engine.pairrun``) never imports Textual; the TUI is one
client of it.
"""

__version__ = "0.1.0"

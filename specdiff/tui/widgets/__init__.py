"""Widgets that render records, one per module: a lane pane (its tokens and margin
strip), the divergence panel, the legend, the aligned view, the footer and the one-line
text widget; `styles` holds the one colour hierarchy they all draw with.

The names are gathered here for callers that want a widget without knowing its module.
"""

from specdiff.tui.view_state import LaneState, lane_differences, near_ties_before, pending_forecast
from specdiff.tui.widgets.aligned_view import (
    ALIGNED_CONTEXT,
    AlignedView,
    aligned_parts,
    aligned_text,
)
from specdiff.tui.widgets.base import LineDrawn, ThemeAware
from specdiff.tui.widgets.footer import FittedFooter
from specdiff.tui.widgets.lane_pane import LanePane
from specdiff.tui.widgets.legend import (
    FORECAST_LEGEND,
    LEGEND,
    LEGEND_ROWS,
    Legend,
    LegendEntry,
    legend_text,
)
from specdiff.tui.widgets.line import Line
from specdiff.tui.widgets.margin_strip import (
    MarginStrip,
    strip_cell_kind,
    strip_cell_style,
    strip_columns,
    strip_height,
    strip_kind_style,
)
from specdiff.tui.widgets.panel import Panel
from specdiff.tui.widgets.panel_text import PanelView, panel_renderable, render_panel
from specdiff.tui.widgets.styles import (
    FORECAST,
    FORECAST_SHOWN,
    FORK,
    ONLY_A,
    ONLY_B,
    SHADE_LEVELS,
    SHARED,
    SHARED_AFTER,
    Look,
    Palette,
    TokenMarks,
    TokenStyles,
    look_style,
    shade,
    shade_level,
)
from specdiff.tui.widgets.token_view import TAB, TokenView
from specdiff.tui.widgets.without_controls import WithoutControls

__all__ = [
    "ALIGNED_CONTEXT",
    "FORECAST",
    "FORECAST_LEGEND",
    "FORECAST_SHOWN",
    "FORK",
    "LEGEND",
    "LEGEND_ROWS",
    "ONLY_A",
    "ONLY_B",
    "SHADE_LEVELS",
    "SHARED",
    "SHARED_AFTER",
    "TAB",
    "AlignedView",
    "FittedFooter",
    "LanePane",
    "LaneState",
    "Legend",
    "LegendEntry",
    "Line",
    "LineDrawn",
    "Look",
    "MarginStrip",
    "Palette",
    "Panel",
    "PanelView",
    "ThemeAware",
    "TokenMarks",
    "TokenStyles",
    "TokenView",
    "WithoutControls",
    "aligned_parts",
    "aligned_text",
    "lane_differences",
    "legend_text",
    "look_style",
    "near_ties_before",
    "panel_renderable",
    "pending_forecast",
    "render_panel",
    "shade",
    "shade_level",
    "strip_cell_kind",
    "strip_cell_style",
    "strip_columns",
    "strip_height",
    "strip_kind_style",
]

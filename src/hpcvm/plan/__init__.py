"""plan stage of the hpcvm pipeline (see DESIGN.md)."""

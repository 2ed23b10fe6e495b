"""Per-kind cache policies (full, sliding, chunked, state, image), chosen by a dict from spec type."""

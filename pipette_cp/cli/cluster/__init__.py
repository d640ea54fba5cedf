"""``pipette-cp cluster``: generate, import, measure and compare cluster files."""

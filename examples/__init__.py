"""Small self-contained examples that sit beside the lab and import nothing from it."""

"""Adapters to environments people already have (optional extras, imported only when used)."""

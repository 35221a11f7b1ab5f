"""Numbered, append-only revisions of the store.db schema."""

"""Search: the fastest layout of a model on a cluster that fits (DESIGN.md §10; docs/search.md)."""

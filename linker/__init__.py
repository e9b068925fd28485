"""Linker: readers for each raw format and the per-rank linked trace on one integer clock."""

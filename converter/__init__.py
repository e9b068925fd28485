"""Converter: linked trace -> Chakra graph, and Chakra ET readers, writers and checks."""

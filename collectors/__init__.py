"""Collectors: thin hooks that run inside the user's job and only record."""

"""The ground floor every folder imports (collectors, linker, converter, the CLI): the one error
type for bad input (errors.py) and progress reporting (progress.py). Imports nothing else of
the project, so the arrows in the tree point one way: down to here."""

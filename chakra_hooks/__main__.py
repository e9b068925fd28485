"""The ``chakra-hooks`` command and ``python -m chakra_hooks``.

``convert -j N`` starts its workers with Python's spawn method, which runs the parent's main
script again in each of them: the command's script imports this module only, and the CLI with
its libraries (click) is imported by :func:`main`, in the parent alone.
"""

from __future__ import annotations


def main() -> None:
    from chakra_hooks.cli import main as run

    run()


if __name__ == "__main__":
    main()

from chakra_hooks.cli import main

main()

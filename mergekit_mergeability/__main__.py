"""``python -m mergekit_mergeability``: the command line, where the console script is not on PATH."""

from mergekit_mergeability.cli import main

main()

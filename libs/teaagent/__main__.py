"""``python -m teaagent`` runs the command line."""

from teaagent.cli import main

if __name__ == "__main__":
    main()

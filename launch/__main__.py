"""`python -m launch ...` is `dtorch-launch ...`."""

from launch.cli import main

if __name__ == "__main__":
    main()

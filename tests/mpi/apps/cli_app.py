"""`python -m hpcckpt ARGS` as an MPI job's program (run_mpi runs a script of this folder)."""
import sys

from hpcckpt.cli import main

sys.exit(main(sys.argv[1:]))

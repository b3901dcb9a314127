"""`python report_host.py SCRIPT ARGS...`: print `HOST rank hostname`, then
run SCRIPT as __main__ with ARGS (so a job shows which rank ran on which
node without changing the script it runs)."""
import os
import runpy
import socket
import sys

print(f"HOST {os.environ.get('RANK')} {socket.gethostname()}", flush=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

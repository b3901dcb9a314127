"""A toy rendezvous that proves the ranks agree on one job: rank 0
listens on MASTER_ADDR:MASTER_PORT, every other rank connects and sends
`token rank`; rank 0 checks the tokens and prints the ranks it saw."""
import os
import socket
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
token = os.environ["DTORCH_RDZV_TOKEN"]
if rank == 0:
    srv = socket.create_server((addr, port))
    srv.settimeout(120)   # a loaded machine starts ranks slowly
    seen = [0]
    for _ in range(world - 1):
        conn, _ = srv.accept()
        with conn:
            their_token, their_rank = conn.recv(256).decode().split()
            assert their_token == token, "token mismatch"
            seen.append(int(their_rank))
    print("JOINED " + " ".join(map(str, sorted(seen))), flush=True)
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection((addr, port), timeout=5) as c:
                c.sendall(f"{token} {rank}".encode())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    print(f"rank {rank} joined", flush=True)

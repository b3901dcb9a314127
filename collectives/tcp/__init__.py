"""`tcp` backend: ring collectives over sockets, for jobs without MPI.

group.py: TCPGroup and tcp_group (set-up, async lanes, p2p, teardown);
transport.py: connections and the loops that move ring messages;
pipe.py: the same-host shared-memory pipe between ring neighbours;
rings.py: the ring algorithms.
"""
from .group import TCPGroup, tcp_group

__all__ = ['TCPGroup', 'tcp_group']

"""``init_device_mesh``: the world's ranks laid out as an n-dimensional
mesh, one process group per mesh dimension (PyTorch's
``torch.distributed.device_mesh`` names).

    mesh = init_device_mesh("cpu", (2, 2, 2),
                            mesh_dim_names=("pp", "dp", "tp"))
    tp_group = mesh["tp"].get_group()      # or mesh.get_group("tp")
    mesh.get_local_rank("pp")              # this rank's pipeline stage

Ranks fill the mesh in row-major order: the last dimension varies fastest,
so consecutive ranks share a group of the last dimension. Put the dimension
that talks most (tensor parallel: every layer) last, so its ranks are on
one node, and the one that talks least (pipeline: one activation per
micro-batch) first.
"""
import itertools

import numpy as np

from .. import distributed as dist

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-dimensional layout of global ranks with one process group per
    dimension for this rank. Build it with ``init_device_mesh``.

    Attributes: ``device_type``, ``mesh`` (an int array of global ranks),
    ``mesh_dim_names``, ``ndim``, ``shape``."""

    def __init__(self, device_type, mesh, mesh_dim_names, groups, rank):
        self.device_type = device_type
        self.mesh = np.asarray(mesh)
        self.mesh_dim_names = (tuple(mesh_dim_names)
                               if mesh_dim_names else None)
        self._groups = list(groups)     # one per dim (this rank's)
        self._rank = rank

    @property
    def ndim(self):
        return self.mesh.ndim

    @property
    def shape(self):
        return tuple(self.mesh.shape)

    def size(self, mesh_dim=None):
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, d):
        if isinstance(d, str):
            if not self.mesh_dim_names or d not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {d!r} not found in "
                               f"mesh_dim_names {self.mesh_dim_names}")
            return self.mesh_dim_names.index(d)
        d = int(d)
        if not -self.ndim <= d < self.ndim:
            raise IndexError(f"mesh dimension {d} is out of range for a "
                             f"{self.ndim}-d mesh")
        return d % self.ndim

    def get_coordinate(self):
        """This rank's index along each dimension (None if not in it)."""
        where = np.argwhere(self.mesh == self._rank)
        return [int(i) for i in where[0]] if len(where) else None

    def get_local_rank(self, mesh_dim=None):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError("get_local_rank() of a mesh with more "
                                   "than one dimension needs mesh_dim")
            mesh_dim = 0
        return self.get_coordinate()[self._dim(mesh_dim)]

    def get_rank(self):
        """This process's global rank."""
        return self._rank

    def get_group(self, mesh_dim=None):
        """The process group of ``mesh_dim``: the ranks that share this
        rank's coordinates in every other dimension."""
        if mesh_dim is None:
            if self.ndim != 1:
                dims = self.mesh_dim_names or list(range(self.ndim))
                raise RuntimeError(f"get_group() of a {self.ndim}-d mesh "
                                   f"needs mesh_dim (one of {dims})")
            mesh_dim = 0
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self):
        return list(self._groups)

    def __getitem__(self, names):
        """The sub-mesh of the named dimensions through this rank
        (``mesh["dp"]``, ``mesh["dp", "tp"]``)."""
        if isinstance(names, str):
            names = (names,)
        dims = [self._dim(n) for n in names]
        if len(set(dims)) != len(dims):
            raise ValueError(f"mesh dimensions {names} repeat")
        coord = self.get_coordinate()
        idx = tuple(slice(None) if d in dims else coord[d]
                    for d in range(self.ndim))
        sub = self.mesh[idx]
        # the kept dims in the order asked for
        kept = [d for d in range(self.ndim) if d in dims]
        sub = np.transpose(sub, [kept.index(d) for d in dims])
        return DeviceMesh(self.device_type, sub,
                          [self.mesh_dim_names[d] for d in dims]
                          if self.mesh_dim_names else None,
                          [self._groups[d] for d in dims], self._rank)

    def __repr__(self):
        names = (f", mesh_dim_names={self.mesh_dim_names}"
                 if self.mesh_dim_names else "")
        return (f"DeviceMesh('{self.device_type}', "
                f"{self.mesh.tolist()}{names})")


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None):
    """Lay the world's ranks out as a mesh of ``mesh_shape`` and make one
    process group per dimension. A collective: every rank calls it, with
    the same arguments. Initialises the default process group first if
    needed (as PyTorch does)."""
    shape = tuple(int(s) for s in mesh_shape)
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"mesh_shape must be a non-empty tuple of "
                         f"positive sizes, got {tuple(mesh_shape)}")
    if mesh_dim_names is not None:
        mesh_dim_names = tuple(mesh_dim_names)
        if len(mesh_dim_names) != len(shape):
            raise ValueError(
                f"mesh_dim_names {mesh_dim_names} must name each of the "
                f"{len(shape)} dimensions of mesh_shape {shape}")
        if len(set(mesh_dim_names)) != len(mesh_dim_names):
            raise RuntimeError(f"mesh_dim_names {mesh_dim_names} must be "
                               f"unique")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got "
                         f"{device_type!r}")
    if not dist.is_initialized():
        dist.init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    total = int(np.prod(shape))
    if total != world:
        names = (" x ".join(f"{n}={s}" for n, s in zip(mesh_dim_names,
                                                          shape))
                 if mesh_dim_names else " x ".join(map(str, shape)))
        raise ValueError(f"init_device_mesh: mesh {names} has {total} "
                         f"ranks but the world has {world}")
    world_ranks = dist.get_process_group_ranks(None)
    mesh = np.asarray(world_ranks).reshape(shape)
    groups = []
    for d in range(len(shape)):
        mine = None
        # every rank creates every group of this dim, in the same order
        # (new_group is a collective over the world)
        others = [range(s) for i, s in enumerate(shape) if i != d]
        for rest in itertools.product(*others):
            idx = list(rest)
            idx.insert(d, slice(None))
            ranks = [int(r) for r in mesh[tuple(idx)]]
            g = dist.new_group(ranks)
            if rank in ranks:
                mine = g
        groups.append(mine)
    return DeviceMesh(device_type, mesh, mesh_dim_names, groups, rank)

"""A small GPT trained char-level with data x tensor x pipeline x context
parallelism.

    python examples/gpt.py                                  # 1 rank
    mpiexec -n 2 python -m mpi4py examples/gpt.py --pp 2    # 2 stages
    mpiexec -n 4 python -m mpi4py examples/gpt.py --dp 2 --tp 2
    dtorch-launch --nproc-per-node 4 examples/gpt.py --tp 2 --pp 2
    dtorch-launch --nproc-per-node 4 examples/gpt.py --dp 2 --cp 2
    GPT_ARGS="--pp 2" sbatch slurm/train_gpt.sbatch

The model: token + position embedding, --n-layer blocks of causal
multi-head attention and an MLP (pre-LayerNorm, residual), a final
LayerNorm and a head whose weight is the token embedding's (weight tying).
The text is examples/data/tiny_tales.txt (a synthetic public-domain corpus,
see examples/data/make_corpus.py), one token per character.

The world (--dp x --tp x --pp x --cp ranks) is a device mesh ("pp", "dp",
"cp", "tp"), tensor parallel innermost (consecutive ranks: it talks every
layer), context parallel next (it talks in every attention):
- TP: the attention heads and the MLP's hidden units are split over the TP
  ranks (Column- then RowParallelLinear: one all-reduce each), the
  vocabulary of the embedding (VocabParallelEmbedding) and so of the tied
  head too;
- PP: the chain embedding, blocks, norm, head is cut into --pp stages of
  about equal numbers of blocks (dtorch.distributed.pipelining); a batch
  goes through as --microbatches micro-batches (1F1B or GPipe). The first
  and last stage each hold a copy of the tied embedding weight; their
  gradients are summed after backward;
- DP: each stage is wrapped in DistributedDataParallel over its DP group,
  and every DP replica draws its own batches;
- CP: the sequence of each batch is split over the CP ranks (two chunks
  each, dtorch.distributed.tensor.experimental.context_parallel: tokens,
  targets and the position ids follow the chunks) and attention runs
  across them (--cp-algorithm ring or ulysses). The CP ranks of a replica
  hold the same parameters and see different tokens, so DDP averages the
  gradients over DP x CP.
The same seed gives the same model on any layout (each rank builds the
full model and keeps its part), so a run's losses do not depend on how it
is split (up to rounding).

Checkpoints hold the full model and optimizer state keyed by parameter
name (TP shards gathered, pipeline stages merged), so a run resumes on any
layout. Global rank 0 writes one every --checkpoint-every steps and at the
end; a restarted job (DTORCH_RESTART_COUNT > 0) or --resume continues from
it, otherwise a run starts fresh; SIGUSR1 makes every rank stop at the
same step, checkpoint and exit 0.
"""
import argparse
import contextlib
import math
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtorch as torch  # noqa: E402
import dtorch.distributed as dist  # noqa: E402
from dtorch import nn  # noqa: E402
from dtorch.distributed.device_mesh import init_device_mesh  # noqa: E402
from dtorch.distributed.tensor.experimental import (  # noqa: E402
    context_parallel, set_rotate_method)
from dtorch.distributed.pipelining import (PipelineStage,  # noqa: E402
                                           Schedule1F1B, ScheduleGPipe,
                                           pipeline)
from dtorch.nn.parallel import (ColumnParallelLinear,  # noqa: E402
                                DistributedDataParallel, RowParallelLinear,
                                VocabParallelEmbedding)
from dtorch.nn.parallel import tensor_parallel as tp  # noqa: E402
from dtorch.utils.checkpoint import checkpoint  # noqa: E402
from digits_common import (HelpFormatter, discard, everyone_stops,  # noqa
                           restart_count)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                    "tiny_tales.txt")
_stop = [False]


# ================================================================= model ==

class Embedding(nn.Module):
    """Token (vocabulary split over TP) + learned position embedding. The
    position ids are a buffer (not saved), so that context parallelism
    can shard them with the tokens."""

    def __init__(self, vocab, d_model, block_size, tp_group):
        super().__init__()
        self.tok = VocabParallelEmbedding(vocab, d_model,
                                          process_group=tp_group)
        self.pos = nn.Embedding(block_size, d_model)
        self.register_buffer("pos_ids", torch.arange(block_size),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.pos.num_embeddings:
            raise ValueError(f"sequence of {t} tokens is longer than the "
                             f"block size {self.pos.num_embeddings}")
        return self.tok(idx) + self.pos(self.pos_ids[:t])


class Attention(nn.Module):
    """Causal multi-head self-attention; the heads are split over TP."""

    def __init__(self, d_model, n_head, tp_group):
        super().__init__()
        size = 1 if tp_group is None else dist.get_world_size(tp_group)
        if n_head % size:
            raise ValueError(f"--n-head {n_head} is not divisible by "
                             f"--tp {size}")
        self.local_heads, self.head_dim = n_head // size, d_model // n_head

        def col():
            return ColumnParallelLinear(d_model, d_model,
                                        gather_output=False,
                                        process_group=tp_group)
        self.q, self.k, self.v = col(), col(), col()
        self.proj = RowParallelLinear(d_model, d_model,
                                      input_is_parallel=True,
                                      process_group=tp_group)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(y):
            return y.view(b, t, self.local_heads,
                          self.head_dim).transpose(1, 2)
        y = nn.functional.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
            is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, self.local_heads * self.head_dim)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_head, tp_group):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head, tp_group)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = ColumnParallelLinear(d_model, 4 * d_model,
                                       gather_output=False,
                                       process_group=tp_group)
        self.act = nn.GELU()
        self.out = RowParallelLinear(4 * d_model, d_model,
                                     input_is_parallel=True,
                                     process_group=tp_group)

    # --activation-checkpointing: keep only the block's input for
    # backward, which recomputes the rest (dropout-free here, but the RNG
    # is replayed all the same)
    checkpointing = False

    def forward(self, x):
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)

    def _forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TiedHead(nn.Module):
    """Logits from the token embedding's weight (its TP shard: each rank
    computes the logits of its slice of the vocabulary, then they are
    gathered); the padding rows of the vocabulary are cut off."""

    def __init__(self, tok, vocab, tp_group):
        super().__init__()
        self.vocab = vocab
        self.proj = ColumnParallelLinear(
            tok.embedding_dim, tok.num_embeddings, bias=False,
            gather_output=True, process_group=tp_group)
        self.proj.weight = tok.weight       # the same Parameter: tied

    def forward(self, x):
        return self.proj(x)[..., :self.vocab]


class GPT(nn.Module):
    """A chain (embed, blocks..., ln_f, head): what pipeline() cuts."""

    def __init__(self, vocab, n_layer=4, n_head=4, d_model=64,
                 block_size=64, tp_group=None):
        super().__init__()
        size = 1 if tp_group is None else dist.get_world_size(tp_group)
        # the vocabulary is split over TP: pad it to a multiple of the TP
        # size (times 8: the same padded size, so the same initial weights,
        # for TP 1, 2, 4, 8)
        unit = 8 if 8 % size == 0 else math.lcm(8, size)
        padded = -(-vocab // unit) * unit
        self.vocab = vocab
        self.embed = Embedding(padded, d_model, block_size, tp_group)
        self.blocks = nn.ModuleList(Block(d_model, n_head, tp_group)
                                    for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = TiedHead(self.embed.tok, vocab, tp_group)
        with torch.no_grad():
            # GPT-2's std 0.02 for the embeddings (nn.Embedding's N(0, 1)
            # would make the tied head's first logits ~sqrt(d_model) wide);
            # scaling each shard is scaling the full weight: the same model
            # at every TP size
            self.embed.tok.weight.mul_(0.02)
            self.embed.pos.weight.mul_(0.02)

    def forward(self, idx):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def loss_fn(logits, targets):
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def split_points(n_layer, pp):
    """Flattened chain indices where stages 1..pp-1 start: the blocks
    shared out as evenly as possible (the chain is embed, blocks, ln_f,
    head, so block k is at index 1 + k)."""
    if pp > n_layer:
        raise SystemExit(f"gpt: --pp {pp} stages need at least {pp} blocks"
                         f" (--n-layer is {n_layer})")
    return [1 + round(i * n_layer / pp) for i in range(1, pp)]


# ================================================================== data ==

def load_text(path=DATA):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    lut = {c: i for i, c in enumerate(chars)}
    data = np.fromiter((lut[c] for c in text), np.int64, len(text))
    n = int(len(data) * 0.9)
    return chars, data[:n], data[n:]


def get_batch(data, batch_size, block_size, seed, step, replica):
    """The batch of one DP replica at one step: a pure function of its
    arguments, so a resumed run draws exactly the batches it would have."""
    rng = np.random.default_rng([seed, step, replica])
    starts = rng.integers(0, len(data) - block_size - 1, batch_size)
    x = np.stack([data[s:s + block_size] for s in starts])
    y = np.stack([data[s + 1:s + 1 + block_size] for s in starts])
    return torch.from_numpy(x), torch.from_numpy(y)


# ========================================================== checkpoints ==

def gather_full_state(stage_mod, opt, pp_group):
    """{name: array} of the model and {name: {key: value}} of the optimizer
    state, full (TP gathered, all stages merged); every rank gets them
    (a collective over the TP and pipeline groups)."""
    sd = {k: v.detach().cpu().numpy() for k, v in
          tp.gather_state_dict(stage_mod).items()}
    osd = tp.gather_optimizer_state_dict(stage_mod, opt)
    names = [n for n, _ in stage_mod.named_parameters()]
    ost = {names[int(i)]: {k: (v.detach().cpu().numpy()
                               if isinstance(v, torch.Tensor) else v)
                           for k, v in st.items()}
           for i, st in osd["state"].items()}
    parts = [None] * dist.get_world_size(pp_group)
    dist.all_gather_object(parts, (sd, ost), group=pp_group)
    model, state = {}, {}
    for s, o in parts:
        model.update(s)
        state.update(o)
    return model, state


def load_full_state(stage_mod, opt, ck):
    """This rank's part of a full checkpoint into its stage and
    optimizer (any DP x TP x PP layout)."""
    full = ck["model"]
    mine = {k: full[k] for k in stage_mod.state_dict()}
    stage_mod.load_state_dict(tp.shard_state_dict(stage_mod, mine))
    names = [n for n, _ in stage_mod.named_parameters()]
    osd = opt.state_dict()
    osd["state"] = {i: ck["optimizer"][n] for i, n in enumerate(names)
                    if n in ck["optimizer"]}
    opt.load_state_dict(tp.shard_optimizer_state_dict(stage_mod, osd))


def save_checkpoint(path, stage_mod, opt, pp_group, step, layout, loss):
    model, state = gather_full_state(stage_mod, opt, pp_group)
    if dist.get_rank() == 0:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        wrap = torch.from_numpy
        torch.save({
            "model": {k: wrap(v) for k, v in model.items()},
            "optimizer": {n: {k: wrap(v) if isinstance(v, np.ndarray) else v
                              for k, v in st.items()}
                          for n, st in state.items()},
            "step": step, "layout": layout, "loss": loss}, path)
    dist.barrier()


def plan_start(path, steps, resume):
    """(checkpoint or None, message): resume only when asked (--resume) or
    on a restart of the job, as the other examples do."""
    restarted = restart_count() > 0
    if not os.path.exists(path):
        if resume and not restarted:
            raise SystemExit(f"--resume: no checkpoint at {path}")
        return None, (f"restart {restart_count()}: no checkpoint at {path} "
                      f"yet, starting fresh" if restarted else None)
    if not (resume or restarted):
        return None, (f"starting fresh: {path} holds an earlier run, which "
                      f"this run replaces (--resume continues it)")
    ck = torch.load(path)
    if "step" not in ck or "model" not in ck:
        raise SystemExit(f"{path} is not a checkpoint of examples/gpt.py")
    return ck, (f"resuming from {path} at step {int(ck['step'])} of "
                f"{steps}")


# ================================================================= train ==

def parse(argv):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter)
    ap.add_argument("--dp", type=int, default=None,
                    help="data-parallel replicas (default: world / "
                         "(tp*pp*cp))")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages")
    ap.add_argument("--cp", type=int, default=1,
                    help="context-parallel size (splits each sequence)")
    ap.add_argument("--cp-algorithm", choices=["ring", "ulysses"],
                    default="ring",
                    help="ring: K/V blocks passed round the CP group; "
                         "ulysses: all-to-all over heads")
    ap.add_argument("--cp-rotate", choices=["allgather", "alltoall"],
                    default="allgather",
                    help="how the ring's K/V reach the other ranks in "
                         "forward (alltoall: round the ring, overlapped)")
    ap.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b",
                    help="pipeline schedule (with --pp > 1)")
    ap.add_argument("--microbatches", type=int, default=4,
                    help="micro-batches per batch (divides --batch-size)")
    ap.add_argument("--n-layer", type=int, default=4,
                    help="transformer blocks (at least --pp)")
    ap.add_argument("--n-head", type=int, default=4,
                    help="attention heads (a multiple of --tp)")
    ap.add_argument("--d-model", type=int, default=64,
                    help="embedding width (split evenly over the heads)")
    ap.add_argument("--block-size", type=int, default=64,
                    help="context length in characters")
    ap.add_argument("--batch-size", type=int, default=16,
                    help="sequences per step per DP replica")
    ap.add_argument("--steps", type=int, default=300,
                    help="optimizer steps to train")
    ap.add_argument("--lr", type=float, default=3e-3,
                    help="AdamW's peak learning rate (warm-up, cosine)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model and of the batches")
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute each block's activations in backward "
                         "(utils.checkpoint, non-reentrant)")
    ap.add_argument("--dtype", choices=["float32", "float64"],
                    default="float32", help="parameter dtype")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the rank's GPU (LOCAL_RANK's, made current "
                         "by init_process_group)")
    ap.add_argument("--log-every", type=int, default=25,
                    help="print the loss every N steps")
    ap.add_argument("--checkpoint", default="runs/gpt.safetensors",
                    help="full-model checkpoint, written by global rank 0")
    ap.add_argument("--checkpoint-every", type=int, default=100,
                    help="steps between checkpoints (and one at the end)")
    ap.add_argument("--resume", action="store_true",
                    help="continue from --checkpoint; a restarted job "
                         "(DTORCH_RESTART_COUNT > 0) always does")
    ap.add_argument("--sample", type=int, default=120,
                    help="characters to generate at the end (0: none)")
    return ap.parse_args(argv)


def lr_at(step, args):
    warm = max(1, args.steps // 10)
    if step < warm:
        return args.lr * (step + 1) / warm
    frac = (step - warm) / max(1, args.steps - warm)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def build_model(args, mesh, vocab):
    """The full model, the same on every rank (TP layers keep their
    shards of it)."""
    torch.manual_seed(args.seed)
    model = GPT(vocab, args.n_layer, args.n_head, args.d_model,
                args.block_size, mesh.get_group("tp")).to(
                    getattr(torch, args.dtype))
    for b in model.blocks:
        b.checkpointing = args.activation_checkpointing
    return model


def build_stage(args, mesh, model):
    """This rank's pipeline stage of ``model`` (its module DDP-wrapped
    over the DP group when dp > 1), the plain stage module and the pipe."""
    pp_group, dp_group = mesh.get_group("pp"), data_group(mesh)
    pipe = pipeline(model, split_spec=split_points(args.n_layer, args.pp))
    s = mesh.get_local_rank("pp")
    dev = ("cuda:%d" % torch.cuda.current_device()
           if args.device == "cuda" else "cpu")
    stage_mod = pipe.get_stage_module(s).to(dev)
    run = stage_mod
    if dist.get_world_size(dp_group) > 1:
        # broadcast_buffers=False: the only buffer, the position ids,
        # differs between CP ranks (each holds its chunks' positions)
        run = DistributedDataParallel(stage_mod, process_group=dp_group,
                                      broadcast_buffers=False)
    stage = PipelineStage(run, s, args.pp, dev, group=pp_group,
                          tied_parameters=pipe.tied_parameters(s))
    return stage, stage_mod, pipe


def data_group(mesh):
    """The ranks that hold the same parameters: the DP group, or with CP
    one group over DP x CP (made once per mesh; a collective the first
    time: every rank makes every such group, in the same order)."""
    names = mesh.mesh_dim_names
    if "cp" not in names or mesh.size("cp") == 1:
        return mesh.get_group("dp")
    if getattr(mesh, "_dp_cp", None) is None:
        m = np.moveaxis(mesh.mesh, [names.index("dp"), names.index("cp")],
                        [-2, -1])
        for ranks in m.reshape(-1, mesh.size("dp") * mesh.size("cp")):
            g = dist.new_group([int(r) for r in ranks])
            if mesh.get_rank() in ranks:
                mesh._dp_cp = g
    return mesh._dp_cp


def cp_region(args, mesh, stage_mod, x, y):
    """The step's context-parallel region: the batch, the targets and this
    stage's position ids sharded along the sequence (no-op at --cp 1)."""
    if args.cp == 1:
        return contextlib.nullcontext()
    bufs = [x, y] + [b for n, b in stage_mod.named_buffers()
                     if n.endswith("pos_ids")]
    return context_parallel(mesh["cp"], buffers=bufs,
                            buffer_seq_dims=[1, 1] + [0] * (len(bufs) - 2),
                            no_restore_buffers=[x, y],
                            algorithm=args.cp_algorithm)


def train_step(stage, schedule, x, y):
    """One batch through the pipeline; the losses of its micro-batches on
    the last stage ([] elsewhere)."""
    losses = []
    if stage.is_first and stage.is_last:
        schedule.step(x, target=y, losses=losses, return_outputs=False)
    elif stage.is_first:
        schedule.step(x, return_outputs=False)
    elif stage.is_last:
        schedule.step(target=y, losses=losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)
    return losses


def main(argv=None):
    args = parse(argv)
    if not dist.is_initialized():
        dist.init_process_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    split = args.tp * args.pp * args.cp
    dp = args.dp if args.dp is not None else world // split
    if dp * split != world:
        raise SystemExit(f"gpt: --dp {dp} x --tp {args.tp} x --pp "
                         f"{args.pp} x --cp {args.cp} = {dp * split} ranks, "
                         f"but the world has {world}")
    if args.block_size % (2 * args.cp):
        # equal shares of every sequence: each CP rank's mean loss then
        # weighs as much as the others' in DDP's average
        raise SystemExit(f"gpt: --block-size {args.block_size} must be a "
                         f"multiple of 2 x --cp ({2 * args.cp})")
    if args.batch_size % args.microbatches:
        raise SystemExit(f"gpt: --microbatches {args.microbatches} does not "
                         f"divide --batch-size {args.batch_size}")
    mesh = init_device_mesh(args.device, (args.pp, dp, args.cp, args.tp),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))
    set_rotate_method(args.cp_rotate)
    pp_group = mesh.get_group("pp")
    dp_rank = mesh.get_local_rank("dp")
    try:
        signal.signal(signal.SIGUSR1, lambda *a: _stop.__setitem__(0, True))
    except ValueError:          # not the main thread (threads backend)
        pass

    chars, train, val = load_text()
    model = build_model(args, mesh, len(chars))
    stage, stage_mod, pipe = build_stage(args, mesh, model)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=args.lr,
                            betas=(0.9, 0.95), weight_decay=0.01)
    sched_cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = sched_cls(stage, args.microbatches, loss_fn=loss_fn)
    layout = f"DP {dp} x TP {args.tp} x PP {args.pp}" + (
        f" x CP {args.cp} ({args.cp_algorithm})" if args.cp > 1 else "")

    ck, message = plan_start(args.checkpoint, args.steps, args.resume)
    if message and rank == 0:
        print(message, flush=True)
    start = 0
    if ck is not None:
        load_full_state(stage_mod, opt, ck)
        start = int(ck["step"])
    dist.barrier()                 # every rank has read the checkpoint
    if ck is None and rank == 0:
        discard(args.checkpoint)
    if rank == 0:
        n = sum(p.numel() for p in pipe.module.parameters())
        per = " (this TP rank's shards)" if args.tp > 1 else ""
        print(f"GPT {n / 1e3:.1f}k parameters{per}, vocab {len(chars)}, "
              f"{layout} on {world} ranks, {args.schedule} with "
              f"{args.microbatches} micro-batches\n{pipe}", flush=True)

    tokens = args.batch_size * dp * args.block_size
    last_loss, t0, done = float("nan"), time.perf_counter(), 0
    for step in range(start, args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        x, y = get_batch(train, args.batch_size, args.block_size,
                         args.seed, step, dp_rank)
        opt.zero_grad()
        with cp_region(args, mesh, stage_mod, x, y):
            losses = train_step(stage, schedule, x, y)
        opt.step()
        done += 1
        stop = world > 1 and everyone_stops(_stop[0])
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps \
                or stop:
            last_loss = mean_loss(losses, stage, pp_group, mesh)
            dt = time.perf_counter() - t0
            if rank == 0:
                print(f"step {step + 1:5d}  loss {last_loss:.4f}  "
                      f"{tokens * done / dt:,.0f} tokens/s", flush=True)
            t0, done = time.perf_counter(), 0
        if stop or (step + 1) % args.checkpoint_every == 0 \
                or step + 1 == args.steps:
            save_checkpoint(args.checkpoint, stage_mod, opt, pp_group,
                            step + 1, layout, last_loss)
        if stop:
            if rank == 0:
                print("SIGUSR1: checkpointed, exiting for requeue",
                      flush=True)
            return last_loss
    if args.sample:
        text = sample(stage, args, chars, pp_group, mesh)
        if rank == 0:
            print("sample: " + repr(text), flush=True)
    dist.barrier()
    return last_loss


def mean_loss(losses, stage, pp_group, mesh):
    """The step's loss averaged over micro-batches and DP x CP ranks, on
    every rank (the last stage has it: a sum over the pipeline group)."""
    v = sum(l.item() for l in losses) / max(1, len(losses)) \
        if stage.is_last else 0.0
    t = torch.tensor([v], dtype=torch.float64)
    if stage.num_stages > 1:
        dist.all_reduce(t, group=pp_group)
    dp_group = data_group(mesh)
    if dist.get_world_size(dp_group) > 1:
        dist.all_reduce(t, group=dp_group)
        t = t / dist.get_world_size(dp_group)
    return t.item()


@torch.no_grad()
def sample(stage, args, chars, pp_group, mesh, prompt="Once upon a time"):
    """Greedy continuation of ``prompt`` through the pipeline: each token
    is one forward; the last stage picks it and broadcasts it back to the
    pipeline's first stage."""
    lut = {c: i for i, c in enumerate(chars)}
    ids = [lut[c] for c in prompt if c in lut]
    fwd = ScheduleGPipe(stage, 1)
    last = dist.get_global_rank(pp_group, stage.num_stages - 1) \
        if stage.num_stages > 1 else None
    for _ in range(args.sample):
        ctx = torch.tensor([ids[-args.block_size:]], dtype=torch.int64)
        out = fwd.eval(ctx) if stage.is_first else fwd.eval()
        nxt = torch.zeros(1, dtype=torch.int64)
        if stage.is_last:
            nxt[0] = int(out[0, -1].argmax().item())
        if last is not None:
            dist.broadcast(nxt, src=last, group=pp_group)
        ids.append(int(nxt.item()))
    return "".join(chars[i] for i in ids)


if __name__ == "__main__":
    main()

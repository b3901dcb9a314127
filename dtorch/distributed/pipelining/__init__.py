"""Pipeline parallelism (PyTorch's ``torch.distributed.pipelining``).

    pipe = pipeline(model, split_spec={"blocks.2": SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, "cpu", group=pp_group)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
    if stage.is_first:
        schedule.step(x)
    elif stage.is_last:
        losses = []
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()

Activations and their gradients move between stages with
``dtorch.distributed`` send/recv, so any backend carries them (threads,
tcp, mpi, nccl); a stage that waits past the group timeout raises the
collectives' desync report instead of hanging, and an error inside a stage
names the stage and its rank.
"""
from .schedules import (PipelineScheduleMulti,  # noqa: F401
                        PipelineScheduleSingle, Schedule1F1B, ScheduleGPipe,
                        ScheduleInterleaved1F1B)
from .split import Pipe, SplitPoint, chain_blocks, pipeline  # noqa: F401
from .stage import PipelineStage  # noqa: F401

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B",
           "ScheduleInterleaved1F1B", "PipelineScheduleSingle",
           "PipelineScheduleMulti", "pipeline", "Pipe", "SplitPoint",
           "chain_blocks"]

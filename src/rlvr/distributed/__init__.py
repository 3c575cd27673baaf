"""Many processes and machines: data-parallel learner groups over torch.distributed (`parallel`), and the RL
loop with its roles as Ray actors (`cluster`: rollout workers, learners, the driver's synchronous and
asynchronous loops).

May import: rlvr.core, rlvr.tasks, rlvr.engines, rlvr.algorithms, rlvr.config, rlvr.stages.
"""

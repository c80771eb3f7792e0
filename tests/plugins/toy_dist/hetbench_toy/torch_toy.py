"""A torch strategy written outside hetbench: every rank holds the whole model, and each parameter's gradient is
summed over the ranks (all_reduce, the hetbench backend) the moment its backward has made it. The loss of a rank's
rows is already divided by the global batch, so the sum is the one-process gradient whatever the shares."""

import torch.distributed as dist

from hetbench.train.torch_frontend.parallel import Parallel


class PlainDataParallel(Parallel):
    def __init__(self, model, ctx):
        super().__init__(model, ctx)
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))

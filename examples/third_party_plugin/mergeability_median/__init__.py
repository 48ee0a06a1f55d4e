"""An element-wise median merge, contributed to mergekit as a mergekit-mergeability plugin."""

import torch
from mergekit.merge_methods import TensorBatch, merge_method

from mergekit_mergeability.plugins import hookimpl


@merge_method(name="median", pretty_name="Element-wise median")
def median(batch: TensorBatch) -> torch.Tensor:
    return torch.stack(batch.tensors).median(dim=0).values


@hookimpl
def mergeability_merge_methods():
    return [median]

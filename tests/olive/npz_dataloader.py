"""An Olive user script (a workflow's `data_configs[].user_script`): a dataloader of (feed dict, label) pairs read
from an .npz of qcompiler's calibration layout, one sample each, in order (docs/olive.md)."""
import numpy as np
from olive.data.registry import Registry


@Registry.register_dataloader("qc_test_npz")
def qc_test_npz(dataset, path, **kwargs):
    data = np.load(path)
    return [({k: data[k][i] for k in data.files}, 0) for i in range(len(data[data.files[0]]))]

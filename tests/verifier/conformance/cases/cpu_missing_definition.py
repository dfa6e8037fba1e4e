import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_src = """torch::Tensor relu_forward(torch::Tensor x);"""

ext = load_inline(name="relu_ext", cpp_sources=relu_src, functions=["relu_forward"], extra_cflags=["-O3"], verbose=False)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        pass
    def forward(self, x):
        return ext.relu_forward(x)

"""The ConnectedGraph IR: values with ordered uses, nodes, graphs with subgraphs, and a networkx index."""
from .graph import SINK, SOURCE, Graph
from .invariants import verify
from .model import Model
from .names import NameScope
from .node import Attr, Node
from .tensor import Tensor
from .value import Usage, Value

__all__ = ["Graph", "Model", "Node", "Value", "Usage", "Attr", "Tensor", "NameScope", "verify", "SOURCE", "SINK"]

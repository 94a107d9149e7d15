"""The ConnectedGraph IR: values with ordered uses, nodes, graphs with subgraphs, and a networkx index."""
from qcompiler.ir.graph import SINK, SOURCE, Graph
from qcompiler.ir.invariants import verify
from qcompiler.ir.model import Model
from qcompiler.ir.names import NameScope
from qcompiler.ir.node import Attr, Node
from qcompiler.ir.tensor import Tensor
from qcompiler.ir.value import Usage, Value
from qcompiler.ir.walk import walk_up

__all__ = ["Graph", "Model", "Node", "Value", "Usage", "Attr", "Tensor", "NameScope", "verify", "SOURCE", "SINK",
           "walk_up"]

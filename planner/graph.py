"""The joint forward+backward graph and the split of its nodes into regions."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.fx as fx

from planner.ops import first_tensor, side_effect, written_inputs

__all__ = ["JointGraph", "copy_module", "placed_order"]


def _device_type(arg):
    """A device as its type alone: every rank of a job places its graph on its own device index
    (rank 1's ``cuda:1``), and the ranks must still see one graph."""
    return arg.type if isinstance(arg, torch.device) else arg


def _is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)


def _in_backward(node: fx.Node) -> bool:
    """A node the backward must run whatever it reads: tagged ``must_be_in_backward``, or tagged
    backward by AOTAutograd and either with a side effect (a mutation, a collective such as a
    backward's all-gather, an opaque call), with no inputs (a constant the backward makes for
    itself), or of no tensor value (symbolic sizes).

    Other nodes AOTAutograd tagged backward but that read no tangent are forward values like any
    other (PyTorch's partitioner treats them so): ReLU's backward compares the forward's output
    with 0, and saving that bool mask holds a half (bf16) or a quarter (fp32) of the output's
    bytes; kept in the backward, the plan had to save the output (192 MiB more than PyTorch's
    split on T5 at batch 16).
    """
    tag = node.meta.get("partitioner_tag")
    if tag == "must_be_in_backward":
        return True
    if tag != "is_backward":
        return False
    return (node.op != "call_function" or not node.all_input_nodes or side_effect(node) is not None
            or not isinstance(node.meta.get("val"), torch.Tensor))


def _place_tangent_free(graph: fx.Graph, moved: set[fx.Node]) -> None:
    """Move each node of ``moved`` (tagged backward, yet a forward value: :func:`_in_backward`)
    to just after its inputs, where a forward value is computed: the forward, which runs nodes
    in graph order, would otherwise compute it after the loss and keep its inputs alive through
    the whole forward. Inductor fuses such a pointwise op into its producer's kernel."""
    previous = None
    for node in placed_order(list(graph.nodes), moved):
        if node in moved and previous is not None and previous.next is not node:
            previous.append(node)
        previous = node


def placed_order(nodes: list[fx.Node], moved: set[fx.Node]) -> list[fx.Node]:
    """``nodes`` in order, except that each node of ``moved`` (each with inputs) comes just
    after the last of its inputs among ``nodes``, or first if it reads none of them."""
    if not moved:
        return nodes
    present = set(nodes)
    waiting = {node: len({inp for inp in node.all_input_nodes if inp in present}) for node in moved}
    order: list[fx.Node] = []

    def place(node: fx.Node) -> None:
        order.append(node)
        for user in node.users:
            if user in waiting:
                waiting[user] -= 1
                if waiting[user] == 0:
                    place(user)

    free = [node for node in nodes if node in moved and waiting[node] == 0]  # in order, not a set's
    for node in [*free, *(node for node in nodes if node not in moved)]:
        place(node)
    return order


def copy_module(module: fx.GraphModule) -> fx.GraphModule:
    """``module`` over a copy of its graph: the same node names and order, each node's metadata
    copied (the output node's too, where AOTAutograd describes the outputs), attributes shared."""
    graph = fx.Graph()
    graph._codegen = module.graph._codegen
    copies: dict[fx.Node, fx.Node] = {}
    for node in module.graph.nodes:
        copies[node] = graph.node_copy(node, copies.__getitem__)
    from planner._torch_compat import graph_module

    return graph_module(module, graph)


@dataclass(eq=False)
class JointGraph:
    """AOTAutograd's joint graph: primals and tangents in, forward outputs and gradients out.

    Every node carries ``meta["val"]`` (a FakeTensor, a SymInt or a tuple of them). The forward
    region holds the nodes that do not depend on a tangent: each is computed in the forward and
    either saved for the backward or recomputed there. The backward region holds the rest.
    """

    module: fx.GraphModule
    num_fwd_outputs: int
    joint_inputs: list = field(default_factory=list, repr=False)
    # what inductor passes a partition function beside the graph (static_lifetime_input_indices:
    # the parameters, which PyTorch's partitioner counts free to save)
    partition_kwargs: dict = field(default_factory=dict, repr=False)
    # the module in AOTAutograd's order, where placing the forward values it tagged backward
    # moved nodes (else ``module`` is in that order); a copy of a placed graph is given its
    # original's, never edited (given_module copies it)
    given: fx.GraphModule | None = field(default=None, repr=False)
    # places of the forward outputs the caller frees before the backward begins (seen on a step:
    # planner.compiler), which the schedule does not keep through the backward
    released: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        moved = {n for n in self.graph.nodes if n.op != "output" and n not in self.backward_nodes
                 and n.meta.get("partitioner_tag") == "is_backward"}
        if moved and self.given is None:
            self.given = copy_module(self.module)
        _place_tangent_free(self.graph, moved)

    def given_module(self) -> fx.GraphModule:
        """A copy of the joint graph in the order AOTAutograd handed it over, before the
        forward values it tagged backward were placed after their inputs: what PyTorch's own
        partitioner is given, so that its split here is the one ``torch.compile`` makes (its
        heuristics read the order)."""
        return copy_module(self.given if self.given is not None else self.module)

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph

    def copy(self) -> "JointGraph":
        """The same joint graph over a copy of its nodes (same names, each metadata dict copied,
        its values shared), which outlives what the compile does to the original once it is
        partitioned."""
        return JointGraph(copy_module(self.module), self.num_fwd_outputs, list(self.joint_inputs),
                          dict(self.partition_kwargs), self.given, self.released)

    @cached_property
    def output_node(self) -> fx.Node:
        return next(iter(self.graph.find_nodes(op="output")))

    @cached_property
    def outputs(self) -> list:
        out = self.output_node.args[0]
        return list(out) if isinstance(out, (list, tuple)) else [out]

    @property
    def fwd_outputs(self) -> list:
        return self.outputs[: self.num_fwd_outputs]

    @property
    def bwd_outputs(self) -> list:
        return self.outputs[self.num_fwd_outputs :]

    @cached_property
    def primals(self) -> list[fx.Node]:
        return [n for n in self.graph.find_nodes(op="placeholder") if not _is_tangent(n)]

    @cached_property
    def tangents(self) -> list[fx.Node]:
        return [n for n in self.graph.find_nodes(op="placeholder") if _is_tangent(n)]

    @cached_property
    def backward_nodes(self) -> frozenset[fx.Node]:
        """Nodes that depend on a tangent, or that must run in the backward (see
        :func:`_in_backward`)."""
        backward: set[fx.Node] = set(self.tangents)
        for node in self.graph.nodes:
            if node.op != "output" and (_in_backward(node) or any(inp in backward for inp in node.all_input_nodes)):
                backward.add(node)
        return frozenset(backward)

    @cached_property
    def forward_nodes(self) -> list[fx.Node]:
        """Computing nodes of the forward region, in graph order (placeholders excluded)."""
        return [
            n
            for n in self.graph.nodes
            if n.op not in ("placeholder", "output") and n not in self.backward_nodes
        ]

    @cached_property
    def needed_by_backward(self) -> list[fx.Node]:
        """Forward-region nodes (primals included) that the backward region reads directly."""
        needed: dict[fx.Node, None] = {}
        consumers = [n for n in self.graph.nodes if n in self.backward_nodes]
        for node in consumers:
            for inp in node.all_input_nodes:
                if inp not in self.backward_nodes:
                    needed[inp] = None
        for out in self.bwd_outputs:
            if isinstance(out, fx.Node) and out not in self.backward_nodes:
                needed[out] = None
        return list(needed)

    @cached_property
    def mutated_primals(self) -> frozenset[fx.Node]:
        """Primals the step mutates; reading them in the backward would see the new value.

        Those AOTAutograd copies back after the graph (its output descriptors name them), and
        those the graph writes in place itself: for inductor, AOTAutograd keeps a buffer's update
        in the forward as ``copy_(primal, new)`` (spectral norm's power-iteration vectors), and
        its descriptors then name no mutation."""
        from planner._torch_compat import mutated_primals

        written = {arg for n in self.forward_nodes for arg in written_inputs(n) if arg.op == "placeholder"}
        found = mutated_primals(self.module)
        if found is not None:
            return frozenset(found | written)
        # Without descriptors, a primal fed to a functionalised mutating op is taken as mutated.
        return frozenset(written).union(
            inp for n in self.forward_nodes if str(n.target).split(".")[0].endswith("_functional")
            for inp in n.all_input_nodes if inp.op == "placeholder"
        )

    @cached_property
    def device(self) -> torch.device | None:
        """The device of the graph's first forward tensor (None if it has none)."""
        for node in self.forward_nodes:
            tensor = first_tensor(node.meta.get("val"))
            if tensor is not None:
                return tensor.device
        return None

    @cached_property
    def fingerprint(self) -> str:
        """A hash of the graph's structure (ops, edges, shapes, dtypes), stable across processes and
        the same on every rank (devices hash by type, not index)."""
        h = hashlib.sha256()
        for node in self.graph.nodes:
            val = node.meta.get("val")
            meta = (tuple(val.shape), str(val.dtype)) if hasattr(val, "shape") else type(val).__name__
            args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), _device_type)
            h.update(f"{node.op}|{node.name}|{node.target}|{args}|{kwargs}|{meta}\n".encode())
        h.update(str(self.num_fwd_outputs).encode())
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.graph.nodes)

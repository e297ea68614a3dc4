"""Wiring a forward/backward pair of generated functions into PyTorch autograd."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_unflatten

from thunder_core.errors import ThunderCoreError
from thunder_core.ir.tree import tree_map
from thunder_core.ops.effects import running_backward


class NotTwiceDifferentiable(ThunderCoreError):
    """A gradient of a jitted function's gradient was asked for (``create_graph=True``)."""


def _refuse_create_graph() -> NotTwiceDifferentiable:
    return NotTwiceDifferentiable(
        "thunder_core.jit: a backward that is itself differentiated (torch.autograd.grad(..., create_graph=True) "
        "or .backward(create_graph=True): gradient penalties, double backward, torch.func.hessian) reached a "
        "jitted function. Its compiled backward computes gradients once and is not differentiable again, so "
        "the second-order gradient would be silently wrong. Ways out: run the part that is differentiated "
        "twice eagerly (call the original module or function, not the jitted one, for that step), or compute "
        "the first gradient without create_graph=True."
    )


@dataclass
class TrainingProgram:
    """The compiled forward and backward of one cache entry."""

    forward: object
    backward: object
    output_differentiable: list[bool]
    output_structure: object
    output_treespec: object = None
    retain_grad_outputs: tuple = ()  # flat outputs the program called retain_grad() on
    # Inputs that require grad but get no gradient: passed detached, so that autograd does not
    # walk into their graphs (as eager, which never reaches a tensor the outputs do not use).
    without_gradient: tuple = ()
    # Per input, a bit mask of the flat outputs computed from it (autodiff.joint._outputs_reached):
    # an input none of whose outputs receives a gradient gets None, as in eager.
    outputs_reached: tuple = ()

    def rebuild(self, flat):
        out = tree_map(lambda i: flat[i], self.output_structure)
        if self.output_treespec is not None:
            return tree_unflatten(list(out), self.output_treespec)
        return out

    def __call__(self, *leaves):
        if self.without_gradient:
            leaves = list(leaves)
            for i in self.without_gradient:
                if isinstance(leaves[i], torch.Tensor):
                    leaves[i] = leaves[i].detach()
        flat = ThunderAutogradFunction.apply(self, *leaves)
        if self.retain_grad_outputs:  # the backward fills their .grad (ops.effects.RetainedGrad)
            node = flat[self.retain_grad_outputs[0]].grad_fn
            node.retained_outputs = {i: weakref.ref(flat[i]) for i in self.retain_grad_outputs}
        return self.rebuild(flat)


class ThunderAutogradFunction(torch.autograd.Function):
    """Runs the generated forward, saves what the generated backward reads."""

    @staticmethod
    def forward(ctx, program: TrainingProgram, *leaves):
        outputs, saved = program.forward(*leaves)
        layout = [isinstance(s, torch.Tensor) for s in saved]
        ctx.save_for_backward(*[s for s, is_tensor in zip(saved, layout) if is_tensor])
        ctx.objects = [s for s, is_tensor in zip(saved, layout) if not is_tensor]
        ctx.layout = layout
        ctx.program = program
        constant = [
            o
            for o, differentiable in zip(outputs, program.output_differentiable)
            if isinstance(o, torch.Tensor) and not differentiable
        ]
        if constant:
            ctx.mark_non_differentiable(*constant)
        # An output the loss does not use then gets None, not zeros: its inputs' gradients too.
        ctx.set_materialize_grads(False)
        ctx.output_layouts = [
            (o.shape, o.dtype, o.device) if differentiable else None
            for o, differentiable in zip(outputs, program.output_differentiable)
        ]
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph=True: the gradient would be differentiated again
            raise _refuse_create_graph()
        tensors, objects = iter(ctx.saved_tensors), iter(ctx.objects)
        inputs = [next(tensors) if is_tensor else next(objects) for is_tensor in ctx.layout]
        del tensors
        # The node drops its references (unless retain_graph=True; torch checks): the backward
        # then holds the last ones and frees each after its last use.
        ctx.maybe_clear_saved_tensors()
        program = ctx.program
        unused = 0  # bit mask of the outputs that pass no gradient (none received, or not differentiable)
        for k, (g, layout) in enumerate(zip(grads, ctx.output_layouts)):
            if layout is None:
                unused |= 1 << k
            else:
                if g is None:
                    unused |= 1 << k
                    g = torch.zeros(layout[0], dtype=layout[1], device=layout[2])
                inputs.append(g)
        running_backward.outputs = getattr(ctx, "retained_outputs", None)
        try:
            result = program.backward(inputs)  # empties ``inputs``: each is freed after its last use
        finally:
            running_backward.outputs = None
        if unused and program.outputs_reached:
            result = tuple(
                None if reached and not reached & ~unused else g
                for g, reached in zip(result, program.outputs_reached)
            )
        return (None, *result)

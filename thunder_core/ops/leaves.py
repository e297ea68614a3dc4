"""Torch ops that are thunder_core symbols without a decomposition into prims (leaves).

Convolution, pooling, interpolation, normalization kernels, linear algebra, FFTs, special
functions, sorting and the rest: capture records each as a named symbol (not an opaque
call), so an executor can claim it by name, ``explain`` names it, and autocast's rules see
it. The torch executor runs it with the very same callable eager runs; autodiff uses the
PyTorch-autograd fallback unless a VJP rule is registered. Names that a torch version does
not have are skipped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from thunder_core.ir.symbols import RANDOM
from thunder_core.ops import composite, conversions, creation, elementwise, indexing, nn, reductions, shapes  # noqa: F401
from thunder_core.ops.registry import RANDOM_NAMES, TORCH_SYMBOLS, lookup, register_torch_op

_FUNCTIONAL = """
conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc unfold fold
avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d max_pool1d_with_indices
max_pool2d_with_indices max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d lp_pool1d lp_pool2d
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d
adaptive_max_pool3d adaptive_max_pool1d_with_indices adaptive_max_pool2d_with_indices
adaptive_max_pool3d_with_indices interpolate upsample grid_sample affine_grid pixel_shuffle pixel_unshuffle
channel_shuffle batch_norm group_norm instance_norm local_response_norm normalize cosine_similarity
pairwise_distance pdist embedding_bag one_hot bilinear prelu rrelu hardshrink softshrink
nll_loss kl_div binary_cross_entropy soft_margin_loss margin_ranking_loss multi_margin_loss
multilabel_margin_loss multilabel_soft_margin_loss hinge_embedding_loss cosine_embedding_loss
poisson_nll_loss gaussian_nll_loss triplet_margin_loss triplet_margin_with_distance_loss ctc_loss
linear_cross_entropy
"""
_TORCH = """
linspace logspace eye tensor as_tensor scalar_tensor tril_indices triu_indices
polygamma mvlgamma igamma igammac i0 sinc sgn frac deg2rad rad2deg hypot xlogy lerp fmax fmin logaddexp
logaddexp2 ldexp nextafter heaviside float_power nan_to_num isclose isin isposinf isneginf isreal logit
copysign fmod remainder
scatter_reduce index_reduce index_fill index_copy index_put masked_scatter take take_along_dim put
cumprod cummax cummin logcumsumexp var_mean std_mean median nanmedian mode kthvalue sort argsort msort
nansum nanmean count_nonzero quantile nanquantile aminmax norm dist renorm trace cov corrcoef
einsum kron inner tensordot dot vdot cross cdist trapz trapezoid cumulative_trapezoid block_diag
cartesian_prod combinations broadcast_tensors meshgrid diag diag_embed diagonal diagflat diagonal_scatter
select select_scatter slice_scatter as_strided as_strided_scatter roll rot90 fliplr flipud tile movedim
moveaxis ravel atleast_1d atleast_2d atleast_3d hstack vstack dstack column_stack row_stack hsplit vsplit
dsplit unsafe_split unsafe_chunk split_with_sizes swapaxes swapdims
logdet det polar complex view_as_real view_as_complex angle real imag conj conj_physical resolve_conj
resolve_neg positive frexp histc histogram bucketize searchsorted stft istft vander
cholesky cholesky_inverse cholesky_solve inverse lu_solve lu_unpack matrix_exp pinverse qr svd
triangular_solve geqrf ormqr chain_matmul addbmm
alias_copy view_copy expand_copy narrow_copy permute_copy t_copy transpose_copy squeeze_copy
unsqueeze_copy diagonal_copy as_strided_copy unbind_copy unfold_copy split_with_sizes_copy
native_layer_norm native_group_norm native_batch_norm constant_pad_nd grid_sampler_2d grid_sampler_3d
"""
_NAMESPACED = {
    "linalg": """vector_norm matrix_norm norm cross det diagonal cholesky cholesky_ex vecdot cond eig eigvals
        eigh eigvalsh householder_product ldl_factor ldl_factor_ex ldl_solve matrix_power multi_dot qr slogdet
        vander lu_factor lu_factor_ex lu lu_solve inv inv_ex solve solve_ex solve_triangular svd svdvals
        tensorinv tensorsolve pinv matrix_rank lstsq matrix_exp""",
    "fft": """fft fft2 fftn hfft hfft2 hfftn rfft rfft2 rfftn ifft ifft2 ifftn ihfft ihfft2 ihfftn irfft irfft2
        irfftn fftshift ifftshift fftfreq rfftfreq""",
    "special": """i0e i1 i1e ndtr polygamma xlog1py zeta entr ndtri log_ndtr erfcx airy_ai bessel_j0 bessel_j1
        bessel_y0 bessel_y1 chebyshev_polynomial_t chebyshev_polynomial_u chebyshev_polynomial_v
        chebyshev_polynomial_w hermite_polynomial_h hermite_polynomial_he laguerre_polynomial_l
        legendre_polynomial_p modified_bessel_i0 modified_bessel_i1 modified_bessel_k0 modified_bessel_k1
        scaled_modified_bessel_k0 scaled_modified_bessel_k1 shifted_chebyshev_polynomial_t
        shifted_chebyshev_polynomial_u shifted_chebyshev_polynomial_v shifted_chebyshev_polynomial_w
        spherical_bessel_j0 log1p expm1 exp2 logsumexp softmax log_softmax sinc round digamma psi gammaln
        multigammaln erf erfc erfinv logit""",
}
_METHODS = """
cumprod cummax cummin logcumsumexp median nanmedian mode kthvalue sort argsort msort nansum nanmean
count_nonzero quantile nanquantile aminmax norm dist renorm trace diag diag_embed diagonal diagflat
diagonal_scatter select select_scatter slice_scatter as_strided roll rot90 fliplr flipud tile movedim
moveaxis ravel hsplit vsplit dsplit swapaxes swapdims logdet det angle real imag conj
conj_physical resolve_conj resolve_neg positive frexp histc bucketize stft istft cholesky cholesky_inverse
cholesky_solve inverse lu_solve matrix_exp pinverse qr svd triangular_solve geqrf ormqr scatter_reduce
index_reduce index_fill index_copy index_put masked_scatter take take_along_dim put polygamma mvlgamma
igamma igammac i0 sinc sgn frac deg2rad rad2deg hypot xlogy lerp fmax fmin logaddexp logaddexp2 ldexp
nextafter heaviside float_power nan_to_num isclose isposinf isneginf isreal logit copysign fmod remainder
kron inner dot vdot cross var_mean std_mean addbmm
"""


def _register(name: str, fn, method=None) -> None:
    if name in TORCH_SYMBOLS or lookup(fn) is not None:
        return
    aliases = [method] if method is not None and lookup(method) is None else []
    register_torch_op(name, fn, *aliases, tags=(RANDOM,) if name in RANDOM_NAMES else ())  # F.rrelu draws


def register_leaves() -> None:
    methods = set(_METHODS.split())
    functional = torch.nn.functional
    for name in _FUNCTIONAL.split():
        fn = getattr(functional, name, None)
        if fn is not None:
            _register(name, fn)  # F.unfold is not Tensor.unfold: functional names get no method alias
    for name in _TORCH.split():
        fn = getattr(torch, name, None)
        if fn is not None:
            _register(name, fn, getattr(torch.Tensor, name, None) if name in methods else None)
    for namespace, names in _NAMESPACED.items():
        module = getattr(torch, namespace)
        for name in names.split():
            fn = getattr(module, name, None)
            if fn is not None:
                _register(f"{namespace}.{name}", fn)


register_leaves()


def _updates_when(parameters: list[str], test: Callable[[dict], bool]) -> Callable:
    """``Symbol.updates_arguments`` for a call whose arguments ``test`` reads by name."""

    def updates(bsym) -> bool:
        try:
            bound = inspect.Signature(
                [
                    inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
                    for n in parameters
                ]
            ).bind(*bsym.args, **bsym.kwargs)
        except TypeError:  # a call form this table does not know: assume it updates
            return True
        return test(bound.arguments)

    return updates


def _has_running_stats(arguments: dict) -> bool:
    return arguments.get("running_mean") is not None or arguments.get("running_var") is not None


# Ops that update some of their arguments in some calls, without an in-place name: running
# statistics in training, an embedding's rows renormalized by max_norm.
_HIDDEN_UPDATES = {
    "batch_norm": (
        ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"],
        lambda a: bool(a.get("training")) and _has_running_stats(a),
    ),
    "native_batch_norm": (
        ["input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps"],
        lambda a: bool(a.get("training")) and _has_running_stats(a),
    ),
    "instance_norm": (
        ["input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps"],
        lambda a: a.get("use_input_stats", True) is not False and _has_running_stats(a),
    ),
    "embedding": (
        ["input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse"],
        lambda a: a.get("max_norm") is not None,
    ),
}
for _name, (_parameters, _test) in _HIDDEN_UPDATES.items():
    if _name in TORCH_SYMBOLS:
        TORCH_SYMBOLS[_name].updates_arguments = _updates_when(_parameters, _test)

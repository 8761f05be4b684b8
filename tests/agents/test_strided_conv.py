"""The strided convolution's weight gradient by blocks equals the convolution's
true weight gradient (a NumPy loop and XLA's own), and the Nature CNN using it
trains exactly as with flax's default convolution."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from seedq.agents import strided_conv
from seedq.agents.networks import NatureCNN

pytestmark = pytest.mark.unit


def numpy_weight_grad(x: np.ndarray, g: np.ndarray, kernel: int, stride: int) -> np.ndarray:
    """dW[a, b, c, o] = sum_{n,i,j} x[n, i*s + a, j*s + b, c] * g[n, i, j, o], by loops."""
    n, ho, wo, o = g.shape
    dw = np.zeros((kernel, kernel, x.shape[-1], o))
    for a in range(kernel):
        for b in range(kernel):
            window = x[:, a: a + (ho - 1) * stride + 1: stride, b: b + (wo - 1) * stride + 1: stride, :]
            dw[a, b] = np.einsum("nijc,nijo->co", window, g)
    return dw


@pytest.mark.parametrize("height, width, kernel, stride, channels, features", [
    (84, 84, 8, 4, 4, 32),  # the Nature CNN's first layer
    (20, 20, 4, 2, 32, 64),  # its second
    (23, 26, 4, 2, 3, 5),  # rows and columns the windows do not reach
    (11, 12, 6, 3, 2, 3),
])
def test_weight_grad_by_blocks_matches_a_numpy_loop_and_xla(height, width, kernel, stride, channels, features):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, height, width, channels))
    ho, wo = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    g = rng.normal(size=(3, ho, wo, features))
    got = np.asarray(strided_conv.weight_grad_by_blocks(
        jnp.asarray(x, jnp.float32), jnp.asarray(g, jnp.float32), (kernel, kernel), (stride, stride)))
    np.testing.assert_allclose(got, numpy_weight_grad(x, g, kernel, stride), rtol=1e-4, atol=1e-3)

    w = jnp.asarray(rng.normal(size=(kernel, kernel, channels, features)), jnp.float32)
    _, vjp = jax.vjp(lambda kernel_: lax.conv_general_dilated(
        jnp.asarray(x, jnp.float32), kernel_, (stride, stride), "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC")), w)
    np.testing.assert_allclose(got, np.asarray(vjp(jnp.asarray(g, jnp.float32))[0]), rtol=1e-4, atol=1e-3)


def _nature_cnn_with_flax_convs(obs):
    """The Nature CNN as NatureCNN builds it, with flax's default convolution."""
    x = obs.astype(jnp.float32) / 255.0
    x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
    x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
    return nn.relu(nn.Dense(512)(x.reshape(x.shape[0], -1)))


class _FlaxNatureCNN(nn.Module):
    @nn.compact
    def __call__(self, obs):
        return _nature_cnn_with_flax_convs(obs)


def test_the_nature_cnn_gradients_equal_those_of_flax_default_convolutions():
    obs = jnp.asarray(np.random.default_rng(1).integers(0, 256, size=(5, 84, 84, 4)), jnp.uint8)
    ours, reference = NatureCNN(), _FlaxNatureCNN()
    params = ours.init(jax.random.PRNGKey(0), obs)
    assert jax.tree.structure(params) == jax.tree.structure(reference.init(jax.random.PRNGKey(0), obs))

    def loss(module):
        return lambda p: jnp.sum(jnp.tanh(module.apply(p, obs)) * jnp.arange(512.0))

    got, want = jax.grad(loss(ours))(params), jax.grad(loss(reference))(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4), got, want)
    # The rewrite is what ran: the weight gradient by blocks was traced for both strided layers.
    calls = []
    original = strided_conv.weight_grad_by_blocks

    def spy(*args):
        calls.append(args[2:])
        return original(*args)

    strided_conv.weight_grad_by_blocks = spy
    try:
        jax.grad(loss(ours))(params)
    finally:
        strided_conv.weight_grad_by_blocks = original
    assert calls == [((4, 4), (2, 2)), ((8, 8), (4, 4))]


def test_other_convolutions_are_left_to_xla():
    x = jnp.ones((1, 9, 9, 2))
    for kernel, strides, padding in [((3, 3), (1, 1), "VALID"), ((3, 3), (2, 2), "VALID"), ((4, 4), (2, 2), "SAME")]:
        w = jnp.ones(kernel + (2, 3))
        dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
        assert not strided_conv._blocks_apply(x, w, strides, padding, None, None, dn, 1)
    w = jnp.ones((4, 4, 2, 3))
    dn = lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC"))
    assert strided_conv._blocks_apply(x, w, (2, 2), "VALID", None, None, dn, 1)
    assert strided_conv._blocks_apply(x, w, (2, 2), [(0, 0), (0, 0)], None, None, dn, 1)

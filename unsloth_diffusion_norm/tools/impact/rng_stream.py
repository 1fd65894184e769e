"""The global RNG's noise as the ranks read it: where each row's t and u lie in one uniform stream on
CPU and on CUDA (torch's Philox), and the masked counts read from such a stream."""

import numpy as np

GATHER = 4_000_000  # stream values gathered at once: bounds the memory of the global-RNG draws


DEVICES = ("cuda", "cpu")  # where the run drew its noise: the device input_ids live on
# CUDA's Philox kernel moves the offset by 4 for a draw of at most 4 values x threads per SM x SMs (884,736 on
# an A100, 1,081,344 on an H100); a larger draw moves it further, which the CUDA model does not follow.
CUDA_ONE_OFFSET = 884_736


def stream_reads(layout, device="cuda"):
    """Where each row reads the global generator's stream under the global RNG, for `device`'s generator.
    transformers seeds every rank alike and each rank draws, per micro-batch (B rows, padded length P) in its
    own order, t = rand(B) then u = rand(B, P).
    CPU: one stream of uniforms, a draw of n values taking the next n; every rank starts at 0, so micro-batch
    at offset o reads t = stream[o : o+B], u = stream[o+B : o+B+B·P] row by row and moves o on by B·(1+P).
    CUDA (torch's Philox, DistributionTemplates.h): a draw of up to ~1M values moves the offset by 4 whatever
    its size and its value at flat index e depends only on (seed, offset, e), so draw c of every rank reads
    one block X_c at the same index: the stream is the blocks end to end, each as long as the largest draw
    of its call over the ranks (t of the micro-batch at rank position g is call 2g, u call 2g+1).
    Returns, per row, the index of its t and the end of its u row, and the stream's length.
    A row's maskable positions are the last `maskable` of its u row: the answer is the suffix of the kept
    tokens and the EOS tail follows it (exact for prompt/completion rows; a multi-turn completion mask is
    treated as a suffix of the same size)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    n_mb = len(layout.padded)
    rows = np.bincount(layout.micro_batch, minlength=n_mb)
    order = np.lexsort((np.arange(n_mb), layout.rank))  # by rank, then in the rank's own order
    ranks = layout.rank[order]
    first = np.searchsorted(ranks, ranks)  # each rank's first micro-batch in `order`
    mb, i = layout.micro_batch, layout.position
    if device == "cpu":
        used = rows * (1 + layout.padded)
        before = np.cumsum(used[order]) - used[order]
        offset = np.empty(n_mb, dtype=np.int64)
        offset[order] = before - before[first]  # from 0 on every rank
        t_block, length = rows, int(np.bincount(layout.rank, weights=used).max())
    else:
        position = np.empty(n_mb, dtype=np.int64)
        position[order] = np.arange(n_mb) - first  # the micro-batch's place in its rank's order
        t_calls = np.zeros(position.max() + 1, dtype=np.int64)  # X_2g's length: the largest B at g
        u_calls = np.zeros_like(t_calls)  # X_2g+1's: the largest B·P at g
        np.maximum.at(t_calls, position, rows)
        np.maximum.at(u_calls, position, rows * layout.padded)
        both = t_calls + u_calls
        starts = np.cumsum(both) - both
        offset, t_block, length = starts[position], t_calls[position], int(both.sum())
    t_at = offset[mb] + i
    u_end = offset[mb] + t_block[mb] + (i + 1) * layout.padded[mb]
    return t_at, u_end, length


def stream_counts(layout, stream, eps, reads=None, device="cuda"):
    """Each row's t and masked count, #(u < (1-eps)·t + eps) over its maskable positions, exactly as the
    ranks draw them on `device` from one uniform `stream` (1-D; or [draws, n], one stream a row) laid out
    as stream_reads says (`reads`, its result, saves recomputing it). p is computed in the stream's
    precision, as torch computes it in float32."""
    t_at, u_end, _ = stream_reads(layout, device) if reads is None else reads
    stream = np.asarray(stream)
    stack = np.atleast_2d(stream)
    one = stack.dtype.type
    t = stack[:, t_at]
    p = one(1 - eps) * t + one(eps)
    counts = np.zeros(t.shape, dtype=np.int64)
    m = layout.maskable
    rows = np.flatnonzero(m > 0)
    ends = np.cumsum(m[rows])
    per = max(1, GATHER // len(stack))
    lo = 0
    while lo < len(rows):  # rows in chunks of about GATHER/draws gathered values
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + per, side="right")))
        chunk, width = rows[lo:hi], m[rows[lo:hi]]
        segment = np.cumsum(width) - width  # each row's first value in the gathered block
        at = np.arange(int(width.sum())) - np.repeat(segment, width) + np.repeat(u_end[chunk] - width, width)
        hit = stack[:, at] < np.repeat(p[:, chunk], width, axis=1)
        counts[:, chunk] = np.add.reduceat(hit, segment, axis=1, dtype=np.int64)
        lo = hi
    return (t[0], counts[0]) if stream.ndim == 1 else (t, counts)

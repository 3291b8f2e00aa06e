"""A rank's share of a global batch: its contiguous rows [B*r/N, B*(r+1)/N) (:func:`_share`),
cut from the batch's tensors (:func:`_take`), and a batch's row count (:func:`_rows`)."""

from ._tf import tf_module


def _share(batch, n, r):
    """This rank's rows [B*r/N, B*(r+1)/N) of a global batch of B rows, as (start, end, count);
    a share of no rows (a last batch smaller than the ranks) becomes one row, weighted 0."""
    tf = tf_module()
    start = batch * r // n
    end = batch * (r + 1) // n
    count = end - start
    start = tf.where(count > 0, start, tf.zeros_like(start))
    end = tf.where(count > 0, end, tf.minimum(tf.ones_like(end), batch))
    return start, end, count


def _take(data, start, end):
    tf = tf_module()
    flat = tf.nest.flatten(data)

    def cut(t):
        if t is None:
            return None
        if isinstance(t, tf.SparseTensor):
            raise ValueError("mtxrun --transparent cannot split SparseTensor inputs")
        return t[start:end]

    return tf.nest.pack_sequence_as(data, [cut(t) for t in flat])


def _rows(data):
    tf = tf_module()
    first = next(t for t in tf.nest.flatten(data) if t is not None)
    return tf.shape(first, out_type=tf.int64)[0]

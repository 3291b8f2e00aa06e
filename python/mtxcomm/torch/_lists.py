"""The list forms of the "mtxcomm" backend's collectives (``alltoall`` of lists,
``allgather_coalesced``, ``gather``, ``scatter``): a mixin of ``MtxcommBackend``
(``backend.py``); gather and scatter are alltoalls in which only the root receives or sends.
"""

import torch

from mtxcomm import _core
from mtxcomm.torch import _tensors
from mtxcomm.torch._work import collective


class ListCollectives:
    """alltoall, allgather_coalesced, gather and scatter over lists of tensors, for
    MtxcommBackend (which provides ``allgather``, ``_submit``, ``_submit_each``, ``_work``,
    ``_root`` and the submitter)."""

    @collective
    def alltoall(self, output_tensors, input_tensors, opts):
        return self._alltoall_lists("all_to_all", output_tensors, input_tensors)

    @collective
    def allgather_coalesced(self, output_lists, input_tensors, opts):
        # c10d passes output_lists[rank][i] (ProcessGroupGloo reads it so); allgather takes one
        # list per input, [i][rank]. Read the other way, the result came back transposed.
        if len(output_lists) != self.size():
            raise ValueError(
                "mtxcomm backend: allgather_coalesced: %d output lists for a group "
                "of %d ranks (one per rank)" % (len(output_lists), self.size())
            )
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_tensors):
                raise ValueError(
                    "mtxcomm backend: allgather_coalesced: the output list of rank "
                    "%d has %d tensors for %d inputs" % (r, len(outs), len(input_tensors))
                )
        by_input = [
            [output_lists[r][i] for r in range(self.size())] for i in range(len(input_tensors))
        ]
        return self.allgather(by_input, input_tensors, opts)

    # -- gather, scatter: alltoalls in which only the root receives, or only the root sends --

    @collective
    def gather(self, output_tensors, input_tensors, opts):
        return self._rooted(
            "gather", opts.rootRank, input_tensors, output_tensors, root_sends=False
        )

    @collective
    def scatter(self, output_tensors, input_tensors, opts):
        return self._rooted(
            "scatter", opts.rootRank, output_tensors, input_tensors, root_sends=True
        )

    def _rooted(self, what, root, single, lists, root_sends):
        """gather (root_sends False) or scatter: every rank's one tensor `single`, the root's
        list of size() tensors in `lists` ([[...]]; [] on the others)."""
        root = self._root(root, what)
        t = self._one(single, what, "tensor")
        _tensors.check(t, what)
        none = [torch.empty(0, dtype=t.dtype)] * self.size()
        mine = list(none)
        mine[root] = t
        if self.rank() == root:
            listed = self._one(lists, what, "list (the root's %s_list)" % what)
        elif any(len(x) for x in lists):
            raise ValueError(
                "mtxcomm backend: %s: rank %d is not the root (%d) but was given a "
                "%s_list" % (what, self.rank(), root, what)
            )
        else:
            listed = none
        outs, ins = (mine, listed) if root_sends else (listed, mine)
        # What the Work's result() holds: the root's gathered list, or each rank's scattered
        # tensor.
        result = list(single) if root_sends else [y for x in lists for y in x]
        return self._alltoall_lists(what, outs, ins, result=result)

    @staticmethod
    def _one(items, what, name):
        if len(items) != 1:
            raise ValueError(
                "mtxcomm backend: %s: expected one %s, got %d" % (what, name, len(items))
            )
        return items[0]

    def _alltoall_lists(self, what, output_tensors, input_tensors, result=None):
        """Alltoall of lists: input_tensors[j] goes to rank j, output_tensors[i] comes from
        rank i (one flat alltoall with splits; each output's size is checked against what its
        sender sent). result: the tensors the Work reports (default output_tensors)."""
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(
                "mtxcomm backend: %s: %d output and %d input tensors for a group of "
                "%d ranks" % (what, len(output_tensors), len(input_tensors), n)
            )
        for t in list(output_tensors) + list(input_tensors):
            _tensors.check(t, what)
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            raise TypeError(
                "mtxcomm backend: %s: tensors of several dtypes %s"
                % (what, sorted(str(d) for d in dtypes))
            )
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        b = _tensors.Buf(flat_in, what)
        o = _tensors.Buf(flat_out, what)
        p = self._submit(
            _core.KIND_ALLTOALL,
            [b.ptr()],
            b.code,
            [b.shape()],
            [o.ptr()],
            [o.shape()],
            splits=[t.numel() for t in input_tensors],
        )
        expected = [t.numel() for t in output_tensors]

        def finish(pendings):
            got = list(pendings[0].received_splits())
            if got != expected:
                raise ValueError(
                    "mtxcomm backend: %s on rank %d: the output tensors hold %s "
                    "elements but the ranks sent %s" % (what, self.rank(), expected, got)
                )
            offset = 0
            for t in output_tensors:
                t.copy_(flat_out[offset : offset + t.numel()].view(t.shape))
                offset += t.numel()

        return self._work(
            what, [p], list(output_tensors) if result is None else result, (b, o), finish
        )

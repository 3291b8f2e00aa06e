"""Process sets of the Horovod-style API: for now the global set only (every rank)."""

__all__ = ["ProcessSet", "global_process_set", "communicator"]


class ProcessSet:
    """A set of ranks that run collectives together (Horovod's ``hvd.ProcessSet``)."""

    def __init__(self, ranks):
        self.ranks = sorted(int(r) for r in ranks)
        self.process_set_id = None


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def communicator(process_set, what):
    """None for the global set (its calls run on the engine)."""
    if process_set is None or process_set is global_process_set:
        return None
    raise NotImplementedError("mtxcomm.torch.%s: process sets other than the global one are "
                              "not supported yet" % what)

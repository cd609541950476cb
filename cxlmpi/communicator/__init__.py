"""The communicator layer: CXLComm, the wrapped Intracomm whose buffer
collectives are the compiled dispatcher's (cxlmpi._shim.CommBase:
pyx/shim/*.pxi) and whose derived communicators come back wrapped
(`cxlcomm`); its lower-case (pickle) collectives (`objects`); the counts
of both that ``cxlmpi.stats()`` reports (`stats`)."""

"""The in-repo reference model of SGLang's DSV4 prefill path (PR-era and 0.5.23 forms).

Names follow SGLang wherever a reader would look for them. Every tensor operation goes through the
device layer with its reads and writes declared, so the same code runs on CUDA streams and on the
CPU simulator, and the happens-before tracker sees every access.
"""

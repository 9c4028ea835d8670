"""Keep pytest (``--doctest-modules``) out of the torchvision import stub.

The stub's modules import each other as ``torchvision.*``, which only resolves once
``prepare_sglang()`` has put ``stubs/`` on ``sys.path``; collecting them as ``_sglang.stubs.*``
would fail, and there is nothing in them to test there (``tests/real/test_environment.py``
exercises the stub as SGLang sees it).
"""

collect_ignore = ["stubs"]

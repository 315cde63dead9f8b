"""pytest configuration of the flatmem Python tests (helpers: python_support.py)."""
import os

import flatmem


def pytest_report_header(config):
    return (f"flatmem {flatmem.__version__} from {os.path.dirname(flatmem.__file__)}; "
            f"libflatmem {flatmem.library_version()}")

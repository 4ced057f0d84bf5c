"""Build hook for Strom's one compiled helper, the record walk that validates produced batches
and the parsers of the usual Produce and Fetch requests.

`optional=True`: where no C compiler is at hand the install still succeeds and Strom uses the
same checks written in Python (slower, same answers).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("strom.protocol._records", ["src/strom/protocol/_records.c",
                                                          "src/strom/protocol/_requests.c"],
                             depends=["src/strom/protocol/_slots.h"], optional=True)])

"""Stand-in for @rules_cc//cc:defs.bzl: forwards every rule to Bazel's own.

Bazel 4.2.3's @bazel_tools loads these names from @rules_cc, which it would
otherwise download. Debian's bazel-rules-cc (0.0.4) is too new for Bazel 4.
"""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_shared_library(**attrs):
    native.cc_shared_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def fdo_prefetch_hints(**attrs):
    native.fdo_prefetch_hints(**attrs)

def fdo_profile(**attrs):
    native.fdo_profile(**attrs)

def objc_import(**attrs):
    native.objc_import(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)

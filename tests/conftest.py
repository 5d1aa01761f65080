"""Suite-wide set-up."""

from __future__ import annotations

import signal

# A non-interactive shell starts a background job (`bash .ci/run &`, `nohup ... &`) with SIGINT ignored, the
# ignore is inherited across exec, and Python then installs no KeyboardInterrupt handler: every kvwatch child
# the tests start would ignore the Ctrl-C they send (ci1 here: `kvwatch logs --follow` sat out its 30 s after
# SIGINT). A handled signal is reset to the default on exec, so handling it here gives children a terminal's
# Ctrl-C again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

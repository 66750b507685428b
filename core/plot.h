/* plot.h — `--plot`: run scripts/plot (Python 3 + matplotlib) on an output folder, if they are here. */
#ifndef KV_PLOT_H
#define KV_PLOT_H

#include <stdio.h>

/* Finds a Python 3 that imports matplotlib ($KVSIM_PYTHON, python3 on PATH,
   /usr/bin/python3) and runs scripts/plot DIR (from $KVSIM_DATA or the
   source tree). Messages go to log. Returns 0 when figures were written or
   plotting was skipped (it says "plots skipped: why" visibly), 1 when the
   script ran and failed. */
int kv_plot_folder(const char *dir, FILE *log);

#endif

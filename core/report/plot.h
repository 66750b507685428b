/* plot.h — `--plot`: run scripts/plot (Python 3 + matplotlib) on an output folder, if they are here. */
#ifndef KV_PLOT_H
#define KV_PLOT_H

#include <stdio.h>

#include "core/base/afile.h"

/* Finds a Python 3 that imports matplotlib ($KVSIM_PYTHON, python3 on PATH,
   /usr/bin/python3) and runs scripts/plot DIR (from kvsim's data folder,
   core/base/datadir.h). Messages go to log. Returns 0 when figures were written or
   plotting was skipped (it says "plots skipped: why" visibly), 1 when the
   script ran and failed. The script's output goes to log too, with dir shown as `shown` (NULL:
   dir itself), so plotting a staging folder names the folder it will become. slot (may be
   NULL) names the plotting process while it runs, for the signal handler (afile.h). */
int kv_plot_folder(const char *dir, const char *shown, FILE *log, kv_cleanup_slot *slot);

#endif

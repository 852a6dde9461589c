#!/usr/bin/env bash
# call 3: the remaining kinds arms, the comparison, results back
source .gpu/s/env.sh
ARMS="dflash dflash2 dflash2-dpace dflash-dpace" bash .gpu/s/callD.sh

/*
 * autotune/tune.c -- the tuning loop: time each candidate, keep the fastest.
 */
#include "autotune/autotune.h"

#include <math.h>

awq_status awq_tune(const awq_config *candidates, int n, awq_time_fn time_fn, void *ctx,
                    awq_tune_value *best, int *detail)
{
    if (detail)
        *detail = 0;
    if (!candidates || n <= 0 || !time_fn || !best)
        return AWQ_ERR_CONFIG;
    awq_tune_value b = {{0}, 0.0f};
    float b_rank = 0.0f; /* b.us, or the default's handicapped time */
    int found = 0;
    for (int i = 0; i < n; i++) {
        float us = 0.0f;
        int d = 0;
        awq_status s = time_fn(&candidates[i], &us, &d, ctx);
        if (s == AWQ_ERR_CONFIG)
            continue;
        if (s != AWQ_OK) {
            if (detail)
                *detail = d;
            return s;
        }
        if (!isfinite(us) || us < 0.0f)
            continue;
        const float rank = i == 0 ? us * AWQ_TUNE_DEFAULT_MARGIN : us;
        if (!found || rank < b_rank) {
            b.config = candidates[i];
            b.us = us;
            b_rank = rank;
            found = 1;
        }
    }
    if (!found)
        return AWQ_ERR_CONFIG;
    *best = b;
    return AWQ_OK;
}

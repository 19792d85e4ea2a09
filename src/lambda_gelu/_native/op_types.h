/* op_body.h for each element type, its entry points named with GATE (empty for λ-GELU, _silu for λ-SiLU)
 * and the type's suffix: lg_forward_runs_f32, lg_forward_runs_silu_bf16, ... */
#define T float
#define SUFFIX CAT(GATE, _f32)
#define LD(v) (v)
#define ST(f) (f)
#include "op_body.h"
#undef T
#undef SUFFIX
#undef LD
#undef ST

#define T uint16_t
#define SUFFIX CAT(GATE, _bf16)
#define LD(v) bf16_load(v)
#define ST(f) bf16_store(f)
#include "op_body.h"
#undef T
#undef SUFFIX
#undef LD
#undef ST

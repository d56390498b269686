/*
 * infer_digits: runs the `digits` model of a tensorwire agent from C.
 *
 *   infer_digits URI INPUT [MODEL]
 *
 * URI is the agent's endpoint (shm://NAME, unix:///PATH, tcp://HOST:PORT),
 * INPUT a file of 4 x 64 little-endian float32 (models/build/
 * digits_mlp_input.bin), MODEL the model's name ("digits" by default).
 *
 * It prints the model's signature, runs the model on INPUT, prints the ten
 * logits and the argmax of each row, then runs it again on a copy of the
 * input in a buffer from tw_alloc: over shm:// that buffer lies in the
 * session's shared-memory arena and is sent without a copy (the copy
 * counters say so). Every failure prints tw_last_error() and exits 1.
 */
#include "tensorwire.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define ROWS 4
#define FEATURES 64
#define CLASSES 10

/* Prints why `what` failed and returns the exit status for a failure. */
static int fail(const char *what, tw_status status) {
    fprintf(stderr, "infer_digits: %s failed (%s): %s\n", what, tw_status_name((int)status),
            tw_last_error());
    return 1;
}

/* Prints one declared input or output: `x float32[?, 64]`. */
static void print_info(const char *kind, size_t index, const tw_tensor_info *info) {
    const char *dtype = tw_dtype_name(info->dtype);
    printf("  %s %zu: %s %s[", kind, index, info->name, dtype ? dtype : "?");
    for (size_t d = 0; d < info->ndim; d++) {
        if (d > 0) {
            printf(", ");
        }
        if (info->dims[d] < 0) {
            printf("?");
        } else {
            printf("%lld", (long long)info->dims[d]);
        }
    }
    printf("]\n");
}

/* Prints the model's name, inputs and outputs. */
static int print_signature(const tw_model *model) {
    size_t n_in = tw_model_num_inputs(model);
    size_t n_out = tw_model_num_outputs(model);
    printf("model %s: %zu input(s), %zu output(s)\n", tw_model_name(model), n_in, n_out);
    for (size_t i = 0; i < n_in; i++) {
        tw_tensor_info info;
        tw_status s = tw_model_input(model, i, &info);
        if (s != TW_OK) {
            return fail("tw_model_input", s);
        }
        print_info("input ", i, &info);
    }
    for (size_t i = 0; i < n_out; i++) {
        tw_tensor_info info;
        tw_status s = tw_model_output(model, i, &info);
        if (s != TW_OK) {
            return fail("tw_model_output", s);
        }
        print_info("output", i, &info);
    }
    return 0;
}

/* Reads exactly ROWS * FEATURES floats from `path` into `x`. */
static int read_input(const char *path, float *x) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t n = fread(x, sizeof(float), ROWS * FEATURES, f);
    int extra = fgetc(f);
    fclose(f);
    if (n != ROWS * FEATURES || extra != EOF) {
        fprintf(stderr, "infer_digits: %s is not %d x %d float32\n", path, ROWS, FEATURES);
        return 1;
    }
    return 0;
}

/* Runs the model on `input` into `logits`, and checks the output's shape. */
static int run(const tw_model *model, const tw_tensor *input, float *logits) {
    tw_tensor out = {.data = logits, .capacity = ROWS * CLASSES * sizeof(float)};
    tw_status s = tw_infer(model, input, 1, &out, 1);
    if (s != TW_OK) {
        return fail("tw_infer", s);
    }
    if (out.dtype != TW_DTYPE_F32 || out.ndim != 2 || out.dims[0] != ROWS ||
        out.dims[1] != CLASSES) {
        fprintf(stderr, "infer_digits: expected float32[%d, %d] logits\n", ROWS, CLASSES);
        return 1;
    }
    return 0;
}

/* Input bytes the client has copied so far. */
static int copied(const tw_client *client, uint64_t *bytes) {
    tw_copy_stats stats;
    tw_status s = tw_client_copy_stats(client, &stats);
    if (s != TW_OK) {
        return fail("tw_client_copy_stats", s);
    }
    *bytes = stats.input_bytes_copied;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s URI INPUT [MODEL]\n", argv[0]);
        return 2;
    }
    const char *uri = argv[1];
    const char *model_name = argc > 3 ? argv[3] : "digits";
    static float x[ROWS * FEATURES];
    static float logits[ROWS * CLASSES];
    static float logits2[ROWS * CLASSES];
    if (read_input(argv[2], x) != 0) {
        return 1;
    }

    tw_client *client = NULL;
    tw_model *model = NULL;
    tw_buffer *buffer = NULL;
    int rc = 1;
    tw_status s = tw_connect(uri, 10.0, &client);
    if (s != TW_OK) {
        rc = fail("tw_connect", s);
        goto done;
    }
    printf("connected to %s (libtensorwire %s)\n", uri, tw_version());
    s = tw_model_lookup(client, model_name, &model);
    if (s != TW_OK) {
        rc = fail("tw_model_lookup", s);
        goto done;
    }
    if (print_signature(model) != 0) {
        goto done;
    }

    /* The input in ordinary memory: read where it is (sockets) or copied
     * into the arena once (shm). */
    tw_tensor input = {
        .dtype = TW_DTYPE_F32,
        .ndim = 2,
        .dims = {ROWS, FEATURES},
        .data = x,
        .len = sizeof x,
    };
    uint64_t before, after;
    if (copied(client, &before) != 0 || run(model, &input, logits) != 0 ||
        copied(client, &after) != 0) {
        goto done;
    }
    printf("plain input: %llu input bytes copied\n", (unsigned long long)(after - before));
    for (int r = 0; r < ROWS; r++) {
        int best = 0;
        printf("row %d: logits", r);
        for (int c = 0; c < CLASSES; c++) {
            float v = logits[r * CLASSES + c];
            printf(" %.9g", (double)v);
            if (v > logits[r * CLASSES + best]) {
                best = c;
            }
        }
        printf(" argmax %d\n", best);
    }

    /* The same input in a buffer from tw_alloc: in the arena over shm,
     * where the agent reads it in place. */
    const int64_t dims[2] = {ROWS, FEATURES};
    s = tw_alloc(client, TW_DTYPE_F32, dims, 2, &buffer);
    if (s != TW_OK) {
        rc = fail("tw_alloc", s);
        goto done;
    }
    if (tw_buffer_len(buffer) != sizeof x) {
        fprintf(stderr, "infer_digits: tw_alloc gave %zu bytes\n", tw_buffer_len(buffer));
        goto done;
    }
    memcpy(tw_buffer_data(buffer), x, sizeof x);
    tw_tensor in_arena;
    s = tw_buffer_tensor(buffer, &in_arena);
    if (s != TW_OK) {
        rc = fail("tw_buffer_tensor", s);
        goto done;
    }
    if (copied(client, &before) != 0 || run(model, &in_arena, logits2) != 0 ||
        copied(client, &after) != 0) {
        goto done;
    }
    printf("tw_alloc input: %s, %llu input bytes copied\n",
           tw_buffer_in_arena(buffer) ? "in the shared-memory arena" : "in ordinary memory",
           (unsigned long long)(after - before));
    if (memcmp(logits, logits2, sizeof logits) != 0) {
        fprintf(stderr, "infer_digits: the two runs gave different logits\n");
        goto done;
    }
    printf("same logits from both inputs\n");
    rc = 0;

done:
    tw_buffer_free(buffer);
    tw_model_free(model);
    tw_client_close(client);
    return rc;
}

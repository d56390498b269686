/*
 * capi_errors: the error paths of libtensorwire, from C (run by
 * tests/capi.rs against an agent serving the `digits` model).
 *
 *   capi_errors URI
 *
 * Each check prints `ok   WHAT: STATUS: MESSAGE` or `FAIL WHAT: ...`; the
 * exit status is the number of failed checks.
 */
#include "tensorwire.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

/* Checks that a call returned `want` and that tw_last_error() contains
 * `text`. */
static void expect(const char *what, tw_status got, tw_status want, const char *text) {
    const char *msg = got == TW_OK ? "" : tw_last_error();
    int good = got == want && (text == NULL || strstr(msg, text) != NULL);
    printf("%s %s: %s: %s\n", good ? "ok  " : "FAIL", what, tw_status_name((int)got), msg);
    if (!good) {
        printf("     expected %s with a message containing \"%s\"\n", tw_status_name((int)want),
               text ? text : "");
        failures++;
    }
}

/* Checks a condition. */
static void check(const char *what, int cond) {
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
    if (!cond) {
        failures++;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s URI\n", argv[0]);
        return 100;
    }
    tw_client *client = NULL;
    tw_model *model = NULL;

    /* Connecting. */
    tw_client *none = (tw_client *)&failures;
    expect("bad uri", tw_connect("bogus://nowhere", 2.0, &none), TW_ERR_CONNECT,
           "cannot connect");
    check("bad uri leaves out NULL", none == NULL);
    expect("nothing listening",
           tw_connect("unix:///nonexistent-tensorwire-dir/a.sock", 2.0, &none), TW_ERR_CONNECT,
           "cannot connect");
    expect("null uri", tw_connect(NULL, 0, &none), TW_ERR_NULL_ARGUMENT, "`uri` is NULL");
    expect("bad utf-8 uri", tw_connect("unix:///\xff", 0, &none), TW_ERR_INVALID_ARGUMENT,
           "not UTF-8");
    expect("negative timeout", tw_connect(argv[1], -1.0, &none), TW_ERR_INVALID_ARGUMENT,
           "timeout_s");
    tw_status s = tw_connect(argv[1], 10.0, &client);
    expect("connect", s, TW_OK, NULL);
    if (s != TW_OK) {
        return 1;
    }

    /* Looking models up. */
    tw_model *nomodel = NULL;
    expect("unknown model", tw_model_lookup(client, "no-such-model", &nomodel), TW_ERR_UNKNOWN_MODEL,
           "unknown model");
    expect("null model name", tw_model_lookup(client, NULL, &nomodel), TW_ERR_NULL_ARGUMENT,
           "`name` is NULL");
    s = tw_model_lookup(client, "digits", &model);
    expect("digits", s, TW_OK, NULL);
    if (s != TW_OK) {
        tw_client_close(client);
        return 1;
    }
    tw_tensor_info info;
    expect("input index out of range", tw_model_input(model, 5, &info), TW_ERR_INVALID_ARGUMENT,
           "input 5 does not exist");
    check("status name of an unknown code",
          strcmp(tw_status_name(999), "TW_UNKNOWN_STATUS") == 0);
    check("status name", strcmp(tw_status_name(TW_ERR_TIMEOUT), "TW_ERR_TIMEOUT") == 0);

    /* Inputs that do not fit. */
    static float x[4 * 64];
    static float logits[4 * 10];
    tw_tensor in = {.dtype = TW_DTYPE_F32, .ndim = 2, .dims = {4, 63}, .data = x,
                    .len = 4 * 63 * sizeof(float)};
    tw_tensor out = {.data = logits, .capacity = sizeof logits};
    expect("wrong input shape", tw_infer(model, &in, 1, &out, 1), TW_ERR_INVALID_INPUT,
           "invalid input");
    in.dims[1] = 64;
    expect("wrong input length", tw_infer(model, &in, 1, &out, 1), TW_ERR_INVALID_INPUT,
           "needs 1024 bytes, got 1008");
    in.len = sizeof x;
    in.dtype = TW_DTYPE_I32;
    expect("wrong input dtype", tw_infer(model, &in, 1, &out, 1), TW_ERR_INVALID_INPUT,
           "invalid input");
    in.dtype = 99;
    expect("unknown dtype code", tw_infer(model, &in, 1, &out, 1), TW_ERR_INVALID_INPUT,
           "unknown dtype code 99");
    in.dtype = TW_DTYPE_F32;
    expect("two inputs", tw_infer(model, (const tw_tensor[]){in, in}, 2, &out, 1),
           TW_ERR_INVALID_INPUT, "invalid input");
    expect("null inputs", tw_infer(model, NULL, 1, &out, 1), TW_ERR_NULL_ARGUMENT,
           "`inputs` is NULL");
    expect("null model", tw_infer(NULL, &in, 1, &out, 1), TW_ERR_NULL_ARGUMENT,
           "`model` is NULL");
    expect("output count", tw_infer(model, &in, 1, &out, 2), TW_ERR_INVALID_ARGUMENT,
           "has 1 output(s), n_outputs is 2");

    /* An output buffer too small: the size needed comes back. */
    out.capacity = 16;
    expect("output buffer too small", tw_infer(model, &in, 1, &out, 1), TW_ERR_BUFFER_TOO_SMALL,
           "output 0 (float32[4, 10]) is 160 bytes, its buffer holds 16");
    check("needed size reported", out.len == sizeof logits && out.ndim == 2 && out.dims[0] == 4 &&
                                      out.dims[1] == 10 && out.dtype == TW_DTYPE_F32);

    /* The same through tw_submit / tw_wait: the response is kept, so a
     * second wait with a big enough buffer gets it. */
    tw_ticket *ticket = NULL;
    expect("submit", tw_submit(model, &in, 1, &ticket), TW_OK, NULL);
    expect("wait, buffer too small", tw_wait(ticket, &out, 1, 10.0), TW_ERR_BUFFER_TOO_SMALL,
           "is 160 bytes");
    out.capacity = sizeof logits;
    expect("wait again, big enough", tw_wait(ticket, &out, 1, 10.0), TW_OK, NULL);
    tw_ticket_free(ticket);
    expect("infer", tw_infer(model, &in, 1, &out, 1), TW_OK, NULL);

    /* Arena allocation arguments. */
    tw_buffer *buf = NULL;
    const int64_t bad_dims[2] = {4, -64};
    expect("negative dim", tw_alloc(client, TW_DTYPE_F32, bad_dims, 2, &buf),
           TW_ERR_INVALID_INPUT, "negative");
    expect("alloc null out", tw_alloc(client, TW_DTYPE_F32, bad_dims, 0, NULL),
           TW_ERR_NULL_ARGUMENT, "`out` is NULL");

    tw_model_free(model);
    tw_client_close(client);
    printf("%d failure(s)\n", failures);
    return failures;
}

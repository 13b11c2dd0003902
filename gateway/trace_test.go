package gateway

import (
	"net/http/httptest"
	"testing"
)

func TestPostTrace(t *testing.T) {
	r := httptest.NewRequest("POST", "/acp", nil)
	if postTrace(r).IsValid() {
		t.Error("a POST without traceparent has a trace context")
	}
	r.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	r.Header.Set("tracestate", "k=v")
	sc := postTrace(r)
	if sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || sc.SpanID().String() != "b7ad6b7169203331" ||
		!sc.IsSampled() || !sc.IsRemote() || sc.TraceState().Get("k") != "v" {
		t.Errorf("postTrace = %+v", sc)
	}
	r.Header.Set("traceparent", "00-zz-b7ad6b7169203331-01")
	if postTrace(r).IsValid() {
		t.Error("an invalid traceparent was taken")
	}
}

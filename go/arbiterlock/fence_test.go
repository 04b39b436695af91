package arbiterlock

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAWriteAtAnEarlierTermIsRefused(t *testing.T) {
	cm := &corev1.ConfigMap{}
	if err := Fence(cm, 9); err != nil || cm.Annotations[FenceAnnotation] != "9" {
		t.Fatalf("first write: %v %v", err, cm.Annotations)
	}
	if err := Fence(cm, 10); err != nil || cm.Annotations[FenceAnnotation] != "10" {
		t.Fatalf("a later term, compared as a number: %v %v", err, cm.Annotations)
	}
	if err := Fence(cm, 9); !errors.Is(err, ErrStaleTerm) || cm.Annotations[FenceAnnotation] != "10" {
		t.Fatalf("an earlier term: %v %v", err, cm.Annotations)
	}
	cm.Annotations[FenceAnnotation] = "x"
	if err := Fence(cm, 11); err == nil {
		t.Fatal("a mark that is not a term is an error, not a pass")
	}
}
